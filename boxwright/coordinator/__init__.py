"""The coordinator: the service core's standalone face (``create_coordinator_app``, ``boxwright serve``)."""

from boxwright.coordinator.app import Coordinator, CoordinatorConfigError, create_coordinator_app
from boxwright.coordinator.auth import Authorize, AuthScope, bearer_authorizer, mint_ws_ticket
from boxwright.coordinator.config import CoordinatorConfig, StoreSet, StoreUrlError, open_store_set

__all__ = [
    "AuthScope",
    "Authorize",
    "Coordinator",
    "CoordinatorConfig",
    "CoordinatorConfigError",
    "StoreSet",
    "StoreUrlError",
    "bearer_authorizer",
    "create_coordinator_app",
    "mint_ws_ticket",
    "open_store_set",
]
