"""What the pod compiler and the proxy share: model references and provider prefixes (:mod:`.refs`), model
families (:mod:`.families`), the managed-tool descriptor format (:mod:`.descriptors`) and the data-policy
vocabulary (:mod:`.policy`). It depends only on :mod:`clawstack.common`."""
