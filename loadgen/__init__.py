"""Load generation for OpenAI-compatible servers: trace replay per tenant, reports, benches.

loadgen talks to servers only over HTTP; it imports no other slicegate package.
``python -m loadgen replay|bench|stub``; see ``loadgen/README.md``.
"""
