"""Permissions: which tool calls an agent may run.

Pass them as ``Agent(permissions=[...])``. The deny rules are asked first, then the others in list
order, and the first decision wins; a call no permission allows is denied.

Example:
    ```python
    from orchestrator.permissions import AllowByName, AllowByReadOnly, AskApproval, DenyByName

    permissions = [
        DenyByName("shell", reason="no shell here", stop=True),
        AllowByReadOnly(),
        AllowByName(["search", "read_*"]),
        AskApproval(),  # everything else: ask on the terminal
    ]
    ```
"""

from ._tooling._permissions import AllowByName as AllowByName
from ._tooling._permissions import AllowByReadOnly as AllowByReadOnly
from ._tooling._permissions import Allowed as Allowed
from ._tooling._permissions import ApprovalCallback as ApprovalCallback
from ._tooling._permissions import ApproveLater as ApproveLater
from ._tooling._permissions import AskApproval as AskApproval
from ._tooling._permissions import Decision as Decision
from ._tooling._permissions import Deferred as Deferred
from ._tooling._permissions import Denied as Denied
from ._tooling._permissions import DenyByName as DenyByName
from ._tooling._permissions import Permission as Permission
from ._tooling._permissions import check_permissions as check_permissions
from ._tooling._permissions import decide as decide

__all__ = (
    "AllowByName",
    "AllowByReadOnly",
    "Allowed",
    "ApprovalCallback",
    "ApproveLater",
    "AskApproval",
    "Decision",
    "Deferred",
    "Denied",
    "DenyByName",
    "Permission",
    "check_permissions",
    "decide",
)
