"""cronoq-server: a cronoq scheduler as a service.

The ``cronoq-server`` command (``check-config``, ``migrate``, ``serve``); its configuration
(``load_config()``), HTTP endpoints, Prometheus metrics and structured logs.
"""

from cronoq_server._config import (
    Address,
    LimitSettings,
    ListenSettings,
    LoggingSettings,
    MemoryStoreSettings,
    PoolSettings,
    PostgresStoreSettings,
    RuntimeSettings,
    ServerConfig,
    SqliteStoreSettings,
    StoreSettings,
    TaskLimitSettings,
    TlsSettings,
    TracingSettings,
    load_config,
    mask_dsn,
    open_store,
    remote_pools,
    render_config,
    task_limits,
)
from cronoq_server._errors import ConfigError, ConfigIssue, CronoqServerError

__all__ = [
    "Address",
    "ConfigError",
    "ConfigIssue",
    "CronoqServerError",
    "LimitSettings",
    "ListenSettings",
    "LoggingSettings",
    "MemoryStoreSettings",
    "PoolSettings",
    "PostgresStoreSettings",
    "RuntimeSettings",
    "ServerConfig",
    "SqliteStoreSettings",
    "StoreSettings",
    "TaskLimitSettings",
    "TlsSettings",
    "TracingSettings",
    "load_config",
    "mask_dsn",
    "open_store",
    "remote_pools",
    "render_config",
    "task_limits",
]
