"""Pods and run templates: the ``x-claw`` pod file, validation, compilation, ``claw up`` and ``claw down``."""

from clawstack.pod.artifacts import PodPaths, list_templates, load_template
from clawstack.pod.compile import CompiledPod, CompiledTemplate, compile_pod
from clawstack.pod.errors import BackendError, InterpolationError, LockError, PodError, PodFileError, ValidationError
from clawstack.pod.lock import PodLock
from clawstack.pod.podfile import PodSpec, load_pod
from clawstack.pod.up import compile_only, down, up

__all__ = [
    "BackendError",
    "CompiledPod",
    "CompiledTemplate",
    "InterpolationError",
    "LockError",
    "PodError",
    "PodFileError",
    "PodLock",
    "PodPaths",
    "PodSpec",
    "ValidationError",
    "compile_only",
    "compile_pod",
    "down",
    "list_templates",
    "load_pod",
    "load_template",
    "up",
]
