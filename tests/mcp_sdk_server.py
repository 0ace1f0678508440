"""A small MCP server on the official Python SDK, logging through toolwatch's middleware.

Used by tests/test_mcp_sdk_e2e.py and benchmarks/bench_run.py (wrapped by ``toolwatch run``).
A missing document raises a plain ``ValueError`` (the SDK withholds its text from the client
and from middleware: the middleware still logs ``not_found``); a page past the end of the
listing raises the SDK's ``ToolError`` (its text reaches the result).
"""

import logging
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from toolwatch.mcp_middleware import ToolwatchMiddleware

# Plain stderr logging set up before MCPServer: its default handler renders every
# tool exception as a rich traceback (~0.4 s each on a busy host), which made an
# 80-call enumeration take a minute.
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(message)s")

mcp = MCPServer("docs", middleware=[ToolwatchMiddleware("docs")])
DOCS = {f"doc-{i}": "lorem ipsum " * (5 + i) for i in range(40)}
PAGES = 1000


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


@mcp.tool()
def listDocuments(page: int = 0) -> list[str]:
    """One page of the (long) document listing."""
    if not 0 <= page < PAGES:
        raise ToolError(f"page {page} does not exist")
    return [f"doc-{page * 10 + i}" for i in range(10)]


if __name__ == "__main__":
    mcp.run()
