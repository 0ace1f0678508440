"""A small MCP server on the official Python SDK, logging through toolwatch's middleware.

Used by tests/test_mcp_sdk_e2e.py and benchmarks/bench_run.py (wrapped by ``toolwatch run``).
"""

from mcp.server.mcpserver import MCPServer

from toolwatch.mcp_middleware import ToolwatchMiddleware

mcp = MCPServer("docs", middleware=[ToolwatchMiddleware("docs")])
DOCS = {f"doc-{i}": "lorem ipsum " * (5 + i) for i in range(40)}


@mcp.tool()
def getDocument(documentId: str, api_key: str = "") -> str:
    """Fetch a document by id."""
    if documentId not in DOCS:
        raise ValueError(f"document {documentId} not found")
    return DOCS[documentId]


@mcp.tool()
def searchDocuments(query: str) -> list[str]:
    """Ids of documents whose text contains the query."""
    return [k for k, v in DOCS.items() if query in v][:5]


if __name__ == "__main__":
    mcp.run()
