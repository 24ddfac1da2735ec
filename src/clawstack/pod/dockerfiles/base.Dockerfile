# clawstack/base: the host's Python interpreter at /opt/python and the shared libraries it needs; no shell.
# `claw images build` assembles rootfs.tar on the host from sys.base_prefix; nothing is pulled.
FROM scratch
ADD rootfs.tar /
ENV PATH=/opt/python/bin:/usr/bin:/bin \
    LANG=C.UTF-8 \
    LD_LIBRARY_PATH=/opt/python/lib \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
LABEL claw.role=base
CMD ["python3"]
