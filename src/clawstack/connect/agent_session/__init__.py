"""The agent-session seam: attaching a ClawConnect task to a managed session in a runtime ClawConnect does not own.

A host fills an :class:`AgentSessionRuntimeRegistry` (in code, or through host modules named by
``CLAWCONNECT_AGENT_SESSION_RUNTIME_MODULES`` and :func:`load_runtime_modules`) and injects it into
:class:`~clawstack.connect.service.ConnectService` and the server factories; nothing here is global, and this
package ships no runtime. A ``run_task`` context may carry a marker or a directive block
(:mod:`~clawstack.connect.agent_session.directives`); the attachment it makes is stored durably
(:mod:`~clawstack.connect.agent_session.store`), shown from the stored record when a tool asks and refreshed
through the runtime's ``inspect`` callback in the background (:mod:`~clawstack.connect.agent_session.sessions`,
:mod:`~clawstack.connect.agent_session.dispatch`), normalised (:mod:`~clawstack.connect.agent_session.normalize`)
and shown as ``agentSession`` on task snapshots (:mod:`~clawstack.connect.agent_session.views`).
docs/connect.md ("Managed agent sessions") is the guide.
"""

from clawstack.connect.agent_session.attachments import Attachment, AttachmentStatus
from clawstack.connect.agent_session.directives import Directive, ParsedContext, parse_context
from clawstack.connect.agent_session.dispatch import (
    DEFAULT_CALL_TIMEOUT_MS,
    TIMEOUT_ENV,
    Dispatcher,
    DispatchError,
    DispatchResult,
    call_timeout_ms_from_env,
)
from clawstack.connect.agent_session.loader import ENV_VAR, ModuleLoadReport, load_runtime_modules
from clawstack.connect.agent_session.normalize import Observation, normalize_observation
from clawstack.connect.agent_session.registry import AgentSessionRuntimeRegistry, RuntimeEntry
from clawstack.connect.agent_session.sessions import RESULT_SOURCE, AgentSessions
from clawstack.connect.agent_session.store import AttachmentStore
from clawstack.connect.agent_session.types import (
    RUNTIME_ID_PATTERN,
    STATES,
    AgentSessionRef,
    CallOptions,
    ContinueRequest,
    DetachRequest,
    State,
)
from clawstack.connect.errors import AgentSessionError, AgentSessionRegistrationError, AttachmentStoreError

__all__ = [
    "DEFAULT_CALL_TIMEOUT_MS",
    "ENV_VAR",
    "RESULT_SOURCE",
    "RUNTIME_ID_PATTERN",
    "STATES",
    "TIMEOUT_ENV",
    "AgentSessionError",
    "AgentSessionRef",
    "AgentSessionRegistrationError",
    "AgentSessionRuntimeRegistry",
    "AgentSessions",
    "Attachment",
    "AttachmentStatus",
    "AttachmentStore",
    "AttachmentStoreError",
    "CallOptions",
    "ContinueRequest",
    "DetachRequest",
    "Directive",
    "DispatchError",
    "DispatchResult",
    "Dispatcher",
    "ModuleLoadReport",
    "Observation",
    "ParsedContext",
    "RuntimeEntry",
    "State",
    "call_timeout_ms_from_env",
    "load_runtime_modules",
    "normalize_observation",
    "parse_context",
]
