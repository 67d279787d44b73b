"""The tool bridge: the app's Python tools served to the agent over authenticated MCP (JSON-RPC over HTTP).

``tools`` declares tools, ``core`` answers MCP's tool methods without a transport, ``asgi`` is the
host's HTTP listener (one listener, many runs, one token each), ``remote`` is the co-located seam
where only ``{name, args}`` crosses from the container back to the host, ``guard`` bounds how long
and how many connections a client of any listener boxwright starts may hold (``ServerLimits``).
"""

from .asgi import (
    DEFAULT_MAX_BODY_BYTES,
    AsgiServer,
    BridgeRegistration,
    HostToolBridge,
    ToolBridgeApp,
    bind_address_for,
    host_for_sandbox,
    serve_asgi,
    start_host_tool_bridge,
)
from .core import (
    BRIDGE_FAILED_EVENT,
    BRIDGE_FINISHED_EVENT,
    BRIDGE_STARTED_EVENT,
    LATEST_PROTOCOL_VERSION,
    SERVER_NAME,
    SUPPORTED_PROTOCOL_VERSIONS,
    ToolBridgeCore,
    ToolCallRecord,
    create_tool_bridge_core,
    handle_json_rpc,
)
from .guard import ServerLimits
from .remote import (
    HttpRemoteToolExecutor,
    RemoteToolExecutor,
    ToolDescriptor,
    ToolExecRun,
    execute_host_tool,
    http_remote_tool_executor,
    remote_tool_stubs,
    serve_tool_exec,
    tool_descriptors,
    tool_exec_app,
    tool_exec_path,
)
from .tools import Tool, ToolContext, ToolExecute, as_tool, as_tools, define_tool, invoke_tool, tool

__all__ = [
    "BRIDGE_FAILED_EVENT",
    "BRIDGE_FINISHED_EVENT",
    "BRIDGE_STARTED_EVENT",
    "DEFAULT_MAX_BODY_BYTES",
    "LATEST_PROTOCOL_VERSION",
    "SERVER_NAME",
    "SUPPORTED_PROTOCOL_VERSIONS",
    "AsgiServer",
    "BridgeRegistration",
    "HostToolBridge",
    "HttpRemoteToolExecutor",
    "RemoteToolExecutor",
    "ServerLimits",
    "Tool",
    "ToolBridgeApp",
    "ToolBridgeCore",
    "ToolCallRecord",
    "ToolContext",
    "ToolDescriptor",
    "ToolExecRun",
    "ToolExecute",
    "as_tool",
    "as_tools",
    "bind_address_for",
    "create_tool_bridge_core",
    "define_tool",
    "execute_host_tool",
    "handle_json_rpc",
    "host_for_sandbox",
    "http_remote_tool_executor",
    "invoke_tool",
    "remote_tool_stubs",
    "serve_asgi",
    "serve_tool_exec",
    "start_host_tool_bridge",
    "tool",
    "tool_descriptors",
    "tool_exec_app",
    "tool_exec_path",
]
