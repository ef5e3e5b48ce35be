"""Tool definitions, the registry and the built-in and MCP tools."""
