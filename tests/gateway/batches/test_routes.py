"""The Batch API over the app with a FakeScheduler: files, batches, ownership, cancel, quotas."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import orjson
import pytest

from gateway.config import BatchSettings
from gateway.tenants import parse_tenants
from tests.gateway.batches.helpers import (
    COMPLETIONS,
    auth,
    create,
    jsonl,
    line,
    results,
    submit,
    upload,
    wait_for,
)
from tests.gateway.harness import (
    TENANTS_YAML,
    EngineFactory,
    FakeAdapterHost,
    adapter_folder,
    auth_config,
    make_config,
    record_requests,
    running,
    with_adapters,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

NIGHTLY, IDE = "sk-nightly-1", "sk-ide-1"


async def test_upload_read_list_delete(make_engine: EngineFactory) -> None:
    data = jsonl([line(i) for i in range(3)])
    async with running(auth_config(), make_engine()) as h:
        r = await upload(h.client, NIGHTLY, data)
        assert r.status_code == 200, r.text
        f = r.json()
        assert (f["object"], f["purpose"], f["bytes"], f["status"]) == ("file", "batch",
                                                                        len(data), "processed")
        got = await h.client.get(f"/v1/files/{f['id']}", headers=auth(NIGHTLY))
        assert got.json() == f
        content = await h.client.get(f"/v1/files/{f['id']}/content", headers=auth(NIGHTLY))
        assert content.content == data
        listed = await h.client.get("/v1/files", headers=auth(NIGHTLY))
        assert [x["id"] for x in listed.json()["data"]] == [f["id"]]
        gone = await h.client.delete(f"/v1/files/{f['id']}", headers=auth(NIGHTLY))
        assert gone.json() == {"id": f["id"], "object": "file", "deleted": True}
        again = await h.client.get(f"/v1/files/{f['id']}", headers=auth(NIGHTLY))
        assert again.status_code == 404


async def test_bad_lines_get_a_line_numbered_400_and_nothing_is_stored(
        make_engine: EngineFactory) -> None:
    good = line(0)
    bad = [
        b"{not json",
        orjson.dumps({**good, "custom_id": None}),
        orjson.dumps({**good, "custom_id": "t", "body": {**good["body"], "temperature": -1}}),
        orjson.dumps({**good, "url": "/v1/embeddings", "custom_id": "u"}),
        orjson.dumps({**good, "custom_id": "s", "body": {**good["body"], "stream": True}}),
        orjson.dumps({**good, "custom_id": "m", "body": {**good["body"], "model": "gpt-9"}}),
        orjson.dumps(good),  # a duplicate custom_id
    ]
    data = orjson.dumps(good) + b"\n\n" + b"\n".join(bad) + b"\n"
    async with running(auth_config(), make_engine()) as h:
        r = await upload(h.client, NIGHTLY, data)
        assert r.status_code == 400
        error = r.json()["error"]
        assert (error["param"], error["code"]) == ("file", "invalid_batch_input")
        message = error["message"]
        assert "7 of 8 requests are invalid" in message
        for number, words in ((3, "not valid JSON"), (4, "custom_id"), (5, "body.temperature"),
                              (6, "'url'"), (7, "stream"), (8, "gpt-9"),
                              (9, "already used on line 1")):
            assert f"line {number}: " in message and words in message, (number, message)
        listed = await h.client.get("/v1/files", headers=auth(NIGHTLY))
        assert listed.json()["data"] == []
        assert list((h.app.state.gateway.batches.storage.root).iterdir()) == []


async def test_upload_limits_and_form_errors(make_engine: EngineFactory) -> None:
    config = dataclasses.replace(auth_config(), batch=BatchSettings(max_file_lines=2,
                                                                    max_file_bytes=4096))
    async with running(config, make_engine()) as h:
        three = await upload(h.client, NIGHTLY, jsonl([line(i) for i in range(3)]))
        assert three.status_code == 400 and "limit of 2 requests" in three.text
        huge = await upload(h.client, NIGHTLY, b" " * (4 << 20))
        assert huge.status_code == 413
        wrong = await upload(h.client, NIGHTLY, jsonl([line(0)]), purpose="fine-tune")
        assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "purpose"
        empty = await upload(h.client, NIGHTLY, b"\n\n")
        assert empty.status_code == 400 and "no requests" in empty.text
        missing = await h.client.post("/v1/files", headers=auth(NIGHTLY),
                                      data={"purpose": "batch"})
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "file"
        anonymous = await upload(h.client, "sk-wrong", jsonl([line(0)]))
        assert anonymous.status_code == 401


async def test_batch_runs_to_completed_with_results_in_input_order(
        make_engine: EngineFactory) -> None:
    lines = [line(i) for i in range(12)]
    lines[5]["body"]["max_tokens"] = 10_000  # past the context: a 400 in the error file
    async with running(auth_config(), make_engine(token_delay_s=0.002)) as h:
        created = await submit(h.client, NIGHTLY, lines)
        assert created["status"] == "validating" and created["object"] == "batch"
        done = await wait_for(h.client, NIGHTLY, created["id"])
        assert done["status"] == "completed", done
        assert done["request_counts"] == {"total": 12, "completed": 11, "failed": 1}
        for key in ("in_progress_at", "finalizing_at", "completed_at"):
            assert done[key] is not None, key
        out = await results(h.client, NIGHTLY, done["output_file_id"])
        errors = await results(h.client, NIGHTLY, done["error_file_id"])
        assert [x["custom_id"] for x in out] == [f"req-{i}" for i in range(12) if i != 5]
        assert all(x["response"]["status_code"] == 200 and x["error"] is None for x in out)
        body = out[0]["response"]["body"]
        assert body["object"] == "chat.completion" and body["usage"]["completion_tokens"] == 4
        assert [x["custom_id"] for x in errors] == ["req-5"]
        assert errors[0]["response"]["status_code"] == 400
        assert errors[0]["response"]["body"]["error"]["code"] == "context_length_exceeded"
        meta = await h.client.get(f"/v1/files/{done['output_file_id']}", headers=auth(NIGHTLY))
        assert meta.json()["purpose"] == "batch_output"
        metrics = (await h.client.get("/metrics")).text
        assert 'priority="low",tenant="nightly"' in metrics  # the lines ran in `low`
        assert f'slicegate_batch_requests{{batch="{done["id"]}",state="completed"' in metrics


async def test_an_interactive_tenants_batch_runs_low(make_engine: EngineFactory) -> None:
    async with running(auth_config(), make_engine()) as h:
        batch = await submit(h.client, IDE, [line(i, COMPLETIONS, priority=0) for i in range(3)],
                             COMPLETIONS)
        done = await wait_for(h.client, IDE, batch["id"])
        assert done["request_counts"]["completed"] == 3
        metrics = (await h.client.get("/metrics")).text
        assert 'vllm:request_success_total{finished_reason="length",model_name="tiny",' \
               'priority="low",tenant="ide"} 3.0' in metrics


async def test_another_tenants_key_gets_404_everywhere(make_engine: EngineFactory) -> None:
    async with running(auth_config(), make_engine()) as h:
        batch = await submit(h.client, NIGHTLY, [line(0)])
        done = await wait_for(h.client, NIGHTLY, batch["id"])
        file_id = batch["input_file_id"]
        for method, path in (("GET", f"/v1/files/{file_id}"),
                             ("GET", f"/v1/files/{file_id}/content"),
                             ("GET", f"/v1/files/{done['output_file_id']}/content"),
                             ("DELETE", f"/v1/files/{file_id}"),
                             ("GET", f"/v1/batches/{batch['id']}"),
                             ("POST", f"/v1/batches/{batch['id']}/cancel")):
            r = await h.client.request(method, path, headers=auth(IDE))
            assert r.status_code == 404, (method, path, r.text)
            assert r.json()["error"]["code"] == "not_found"
        stolen = await h.client.post("/v1/batches", headers=auth(IDE), json={
            "input_file_id": file_id, "endpoint": "/v1/chat/completions",
            "completion_window": "24h"})
        assert stolen.status_code == 404
        for path in ("/v1/files", "/v1/batches"):
            assert (await h.client.get(path, headers=auth(IDE))).json()["data"] == []
        mine = await h.client.get(f"/v1/files/{file_id}", headers=auth(NIGHTLY))
        assert mine.status_code == 200


async def test_cancel_mid_batch_puts_every_line_in_one_file(make_engine: EngineFactory) -> None:
    lines = [line(i, max_tokens=40) for i in range(30)]
    async with running(auth_config(), make_engine(token_delay_s=0.01)) as h:
        batch = await submit(h.client, NIGHTLY, lines)
        while (await wait_for(h.client, NIGHTLY, batch["id"], ("in_progress",)))[
                "request_counts"]["completed"] < 2:
            await asyncio.sleep(0.02)
        r = await h.client.post(f"/v1/batches/{batch['id']}/cancel", headers=auth(NIGHTLY))
        assert r.status_code == 200 and r.json()["status"] in ("cancelling", "cancelled")
        done = await wait_for(h.client, NIGHTLY, batch["id"])
        assert done["status"] == "cancelled" and done["cancelled_at"] is not None
        counts = done["request_counts"]
        assert counts["total"] == 30 and counts["completed"] + counts["failed"] == 30
        assert 2 <= counts["completed"] < 30
        out = await results(h.client, NIGHTLY, done["output_file_id"])
        errors = await results(h.client, NIGHTLY, done["error_file_id"])
        ids = [x["custom_id"] for x in out] + [x["custom_id"] for x in errors]
        assert sorted(ids) == sorted(f"req-{i}" for i in range(30))
        assert {x["error"]["code"] for x in errors} == {"batch_cancelled"}
        assert h.fake.num_requests == 0 and h.fake.kv_blocks_in_use == 0
        again = await h.client.post(f"/v1/batches/{batch['id']}/cancel", headers=auth(NIGHTLY))
        assert again.status_code == 200  # cancelling a cancelled batch is a no-op
        finished = await submit(h.client, NIGHTLY, [line(0)])
        await wait_for(h.client, NIGHTLY, finished["id"])
        late = await h.client.post(f"/v1/batches/{finished['id']}/cancel", headers=auth(NIGHTLY))
        assert late.status_code == 409


async def test_lines_whose_url_is_not_the_endpoint_fail_the_batch(
        make_engine: EngineFactory) -> None:
    async with running(auth_config(), make_engine()) as h:
        batch = await submit(h.client, NIGHTLY, [line(0), line(1, COMPLETIONS), line(2)])
        done = await wait_for(h.client, NIGHTLY, batch["id"])
        assert done["status"] == "failed" and done["failed_at"] is not None
        assert [(e["line"], e["param"]) for e in done["errors"]["data"]] == [(2, "url")]


async def test_create_batch_validation(make_engine: EngineFactory) -> None:
    async with running(auth_config(), make_engine()) as h:
        file_id = (await upload(h.client, NIGHTLY, jsonl([line(0)]))).json()["id"]
        base = {"input_file_id": file_id, "endpoint": "/v1/chat/completions",
                "completion_window": "24h"}
        for change, param in (({"endpoint": "/v1/embeddings"}, "endpoint"),
                              ({"completion_window": "1h"}, "completion_window"),
                              ({"input_file_id": None}, "input_file_id"),
                              ({"metadata": {"k": 1}}, "metadata.'k'")):
            r = await h.client.post("/v1/batches", headers=auth(NIGHTLY),
                                    json={**base, **change})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        missing = await create_status(h.client, {**base, "input_file_id": "file-nope"})
        assert missing == 404
        tagged = await create(h.client, NIGHTLY, file_id)
        assert tagged["metadata"] is None


async def create_status(client: object, body: dict[str, object]) -> int:
    r = await client.post("/v1/batches", headers=auth(NIGHTLY), json=body)  # type: ignore[attr-defined]
    return int(r.status_code)


async def test_list_batches_pages_newest_first(make_engine: EngineFactory) -> None:
    async with running(auth_config(), make_engine()) as h:
        file_id = (await upload(h.client, NIGHTLY, jsonl([line(0)]))).json()["id"]
        ids = [(await create(h.client, NIGHTLY, file_id))["id"] for _ in range(3)]
        first = (await h.client.get("/v1/batches?limit=2", headers=auth(NIGHTLY))).json()
        assert [b["id"] for b in first["data"]] == ids[:0:-1] and first["has_more"]
        rest = (await h.client.get(f"/v1/batches?limit=2&after={first['last_id']}",
                                   headers=auth(NIGHTLY))).json()
        assert [b["id"] for b in rest["data"]] == ids[:1] and not rest["has_more"]
        bad = await h.client.get("/v1/batches?limit=0", headers=auth(NIGHTLY))
        assert bad.status_code == 400


async def test_quotas_apply_to_batch_lines(make_engine: EngineFactory) -> None:
    yaml = TENANTS_YAML + "    requests_per_minute: 2\n"  # on the last tenant, nightly
    async with running(make_config(parse_tenants(yaml)), make_engine()) as h:
        batch = await submit(h.client, NIGHTLY, [line(i) for i in range(4)])
        await asyncio.sleep(1.0)
        now = await wait_for(h.client, NIGHTLY, batch["id"], ("in_progress",))
        assert now["request_counts"]["completed"] == 2, now  # the rest waits for the bucket


async def test_a_spent_budget_fails_batch_lines(make_engine: EngineFactory) -> None:
    yaml = TENANTS_YAML + "    budget: {daily_tokens: 60}\n"  # on the last tenant, nightly
    async with running(make_config(parse_tenants(yaml)), make_engine()) as h:
        batch = await submit(h.client, NIGHTLY, [line(i) for i in range(8)])
        done = await wait_for(h.client, NIGHTLY, batch["id"])
        out = await results(h.client, NIGHTLY, done["output_file_id"])
        errors = await results(h.client, NIGHTLY, done["error_file_id"])
        assert out and errors and len(out) + len(errors) == 8, done
        assert sum(x["response"]["body"]["usage"]["total_tokens"] for x in out) <= 60
        assert {x["response"]["body"]["error"]["code"] for x in errors} == {"insufficient_quota"}


async def test_auth_off_batches_belong_to_the_default_tenant(
        make_engine: EngineFactory) -> None:
    async with running(make_config(), make_engine()) as h:
        batch = await submit(h.client, "anything", [line(0), line(1)])
        done = await wait_for(h.client, "anything", batch["id"])
        assert done["request_counts"] == {"total": 2, "completed": 2, "failed": 0}


async def test_a_batch_file_naming_the_base_and_an_adapter(make_engine: EngineFactory,
                                                          tmp_path: Path) -> None:
    """Lines of the base model and of a LoRA adapter in one file: each runs on its own (the
    adapter's in Request.adapter) and answers with its name; an unknown model fails the
    upload with the line number."""
    engine = with_adapters(make_engine(), FakeAdapterHost(), sql=adapter_folder(tmp_path / "a"))
    seen = record_requests(engine)
    async with running(auth_config(), engine) as h:
        lines = [line(i, model="sql" if i % 2 else "tiny") for i in range(4)]
        done = await wait_for(h.client, NIGHTLY, (await submit(h.client, NIGHTLY, lines))["id"])
        assert done["request_counts"] == {"total": 4, "completed": 4, "failed": 0}
        out = await results(h.client, NIGHTLY, done["output_file_id"])
        assert [x["response"]["body"]["model"] for x in out] == ["tiny", "sql", "tiny", "sql"]
        assert sorted(s.adapter or "" for s in seen) == ["", "", "sql", "sql"]
        bad = await upload(h.client, NIGHTLY, jsonl([line(0, model="sql"),
                                                     line(1, model="nope")]))
        assert bad.status_code == 400 and "line 2" in bad.json()["error"]["message"]
        assert "'nope' does not exist" in bad.json()["error"]["message"]
