# clawstack/worker: the one-shot runner (runner type oneshot) on clawstack/base, for the compose backend.
# BASE_IMAGE is the image ID of clawstack/base, passed by `claw images build`.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
# The first three steps are the same as the proxy's, so both images share these layers.
ADD libs.tar /
COPY site /opt/clawstack/site
ENV PYTHONPATH=/opt/clawstack/site
ENV CLAW_TYPE=oneshot
LABEL claw.role=worker claw.type=oneshot
ENTRYPOINT ["python3", "-m", "clawstack.worker.oneshot"]
