"""Pods and run templates: the ``x-claw`` pod file, validation, compilation, ``claw up`` and ``claw down``."""

from clawstack.pod.artifacts import PodPaths, list_templates, load_template
from clawstack.pod.compile import CompiledPod, CompiledTemplate, compile_pod
from clawstack.pod.errors import BackendError, InterpolationError, LockError, PodError, PodFileError, ValidationError
from clawstack.pod.lock import PodLock
from clawstack.pod.netguard import RunsNetwork, ensure_guard, guard_present, remove_guard, runs_network
from clawstack.pod.podfile import PodSpec, load_pod
from clawstack.pod.up import UpResult, compile_only, down, up

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
    "RunsNetwork",
    "UpResult",
    "ValidationError",
    "compile_only",
    "compile_pod",
    "down",
    "ensure_guard",
    "guard_present",
    "list_templates",
    "load_pod",
    "load_template",
    "remove_guard",
    "runs_network",
    "up",
]
