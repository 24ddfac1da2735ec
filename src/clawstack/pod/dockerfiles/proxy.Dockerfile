# clawstack/proxy: clawstack and its runtime dependencies on clawstack/base; runs `claw proxy serve`.
# BASE_IMAGE is the image ID of clawstack/base, passed by `claw images build`.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
# The first three steps are the same as the worker's, so both images share these layers.
ADD libs.tar /
COPY site /opt/clawstack/site
ENV PYTHONPATH=/opt/clawstack/site
LABEL claw.role=proxy
ENTRYPOINT ["python3", "-m", "clawstack"]
CMD ["proxy", "serve", "--config", "/claw/proxy/proxy.json"]
