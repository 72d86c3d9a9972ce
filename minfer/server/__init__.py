"""The OpenAI-compatible HTTP server (`minfer serve`): FastAPI app, request schema, the one
engine loop, metrics and the static chat page. See docs/SERVER.md."""
