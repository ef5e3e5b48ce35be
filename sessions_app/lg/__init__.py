"""A LangGraph-server-compatible door over Terret's sessions (docs/langgraph.md)."""
