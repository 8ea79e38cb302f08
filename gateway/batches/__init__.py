"""The OpenAI Batch API: uploaded JSONL files of requests, run in their tenant's `low` class.

`store` keeps files, batches and per-line results in SQLite; `files` keeps
file bytes on disk and validates uploads; `feeder` runs batch lines through
the gateway's own generation path a few at a time; `routes` are the HTTP
endpoints; `service` ties them to the app's lifespan; `context` is all they
take from the app.
"""
