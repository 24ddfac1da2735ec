# clawstack/hermes: the task-home runner (runner type hermes) on clawstack/worker, for the compose backend: the
# pinned Hermes installation at /opt/hermes/site and a shell with the usual tools for its terminal tool.
# WORKER_IMAGE is the image ID of clawstack/worker, passed by `claw images build`.
ARG WORKER_IMAGE
FROM ${WORKER_IMAGE}
ADD tools.tar /
COPY hermes /opt/hermes/site
ENV CLAW_TYPE=hermes CLAW_HERMES_SITE=/opt/hermes/site CLAW_HOME=/home/task
LABEL claw.role=hermes claw.type=hermes
ENTRYPOINT ["python3", "-m", "clawstack.worker.hermes"]
