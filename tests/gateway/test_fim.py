"""Fill-in-the-middle (`suffix`): the known token sets, the ids fed, the config, the 400s.

The FIM test model is the tiny model's tokenizer with StarCoder's three FIM tokens added
as special tokens, over a FakeScheduler (the fake's vocabulary grows with the tokenizer).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from gateway.__main__ import build_parser, config_from_args
from gateway.config import ConfigError, load_config
from gateway.engine import Engine, load_tokenizer
from gateway.errors import ApiError
from gateway.fim import KNOWN_FIM, FimTokens, detect, parse_fim_setting, resolve_fim
from gateway.prompts import tokenize_completion
from models.default_model import DEFAULT_DIR_NAME, cache_root, is_complete
from models.tiny import corpus
from scheduler.api import Request
from tests.gateway.batches.helpers import COMPLETIONS, results, wait_for
from tests.gateway.batches.helpers import line as batch_line
from tests.gateway.batches.helpers import submit as submit_batch
from tests.gateway.harness import EngineFactory, Harness, auth_config, make_config, running

session_loop = pytest.mark.asyncio(loop_scope="session")

STARCODER = KNOWN_FIM["starcoder"]
PREFIX, SUFFIX = "def add(x, y):\n    return", "\n\nprint(add(1, 2))\n"


def _with_fim(tokenizer: PreTrainedTokenizerBase, tokens: FimTokens) -> PreTrainedTokenizerBase:
    tokenizer.add_special_tokens({"additional_special_tokens": [tokens.prefix, tokens.suffix,
                                                                tokens.middle]})
    return tokenizer


@pytest.fixture(scope="module")
def fim_tokenizer(tiny_model_dir: Path) -> PreTrainedTokenizerBase:
    return _with_fim(load_tokenizer(tiny_model_dir), STARCODER)


@pytest.fixture(scope="module")
def bos_fim_tokenizer(fim_tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """The FIM tokenizer made to put a BOS token first (as Llama's do)."""
    raw = copy.deepcopy(fim_tokenizer.backend_tokenizer)
    bos, bos_id = fim_tokenizer.eos_token, fim_tokenizer.eos_token_id
    raw.post_processor = processors.TemplateProcessing(single=f"{bos} $A",
                                                       special_tokens=[(bos, bos_id)])
    return PreTrainedTokenizerFast(tokenizer_object=raw, bos_token=bos)


def _engine(make: EngineFactory, tokenizer: PreTrainedTokenizerBase, fim: Any = "auto") -> Engine:
    factory = EngineFactory(tokenizer, make.word_ids)
    return dataclasses.replace(factory(), fim=resolve_fim(tokenizer, fim, len(tokenizer)))


@pytest.fixture
async def fim_gateway(make_engine: EngineFactory,
                      fim_tokenizer: PreTrainedTokenizerBase) -> AsyncIterator[Harness]:
    async with running(make_config(), _engine(make_engine, fim_tokenizer)) as harness:
        yield harness


@pytest.fixture
def fed(fim_gateway: Harness, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[int]]]:
    """The prompt ids the scheduler receives, one list per submitted request."""
    seen: list[list[int]] = []
    submit = fim_gateway.fake.submit

    def spy(request: Request) -> Any:
        seen.append(list(request.prompt_token_ids))
        return submit(request)

    monkeypatch.setattr(fim_gateway.fake, "submit", spy)
    yield seen


def _expected(tokenizer: PreTrainedTokenizerBase, prefix: str, suffix: str,
              bos: tuple[int, ...] = ()) -> list[int]:
    p, s, m = (tokenizer.convert_tokens_to_ids(t) for t in (STARCODER.prefix, STARCODER.suffix,
                                                            STARCODER.middle))
    plain = tokenizer.encode  # without special tokens below
    return [*bos, p, *plain(prefix, add_special_tokens=False), s,
            *plain(suffix, add_special_tokens=False), m]


# ---- the known sets, as data ------------------------------------------------------------


class FakeVocab:
    """Just the two lookups detection uses, over a dict vocabulary (id 0 is <unk>)."""

    def __init__(self, tokens: list[str]) -> None:
        self.vocab = {t: i for i, t in enumerate(["<unk>", "a", "b", *tokens])}
        self.by_id = {i: t for t, i in self.vocab.items()}

    def convert_tokens_to_ids(self, token: str) -> int:
        return self.vocab.get(token, 0)

    def convert_ids_to_tokens(self, i: int) -> str:
        return self.by_id[i]


@pytest.mark.parametrize("name", list(KNOWN_FIM))
def test_each_known_set_is_detected_from_the_vocabulary(name: str) -> None:
    t = KNOWN_FIM[name]
    vocab: Any = FakeVocab([t.prefix, t.suffix, t.middle])
    assert detect(vocab, len(vocab.vocab)) == name
    partial: Any = FakeVocab([t.prefix, t.middle])
    assert detect(partial, len(partial.vocab)) is None
    assert detect(vocab, len(vocab.vocab) - 1) is None  # the last token is past the model's


def test_the_tiny_and_default_tokenizers_have_no_fim_tokens(tokenizer: PreTrainedTokenizerBase,
                                                            fim_tokenizer: Any) -> None:
    assert detect(tokenizer, len(tokenizer)) is None
    assert resolve_fim(tokenizer, "auto", len(tokenizer)) is None
    assert detect(fim_tokenizer, len(fim_tokenizer)) == "starcoder"
    default = cache_root() / DEFAULT_DIR_NAME
    if is_complete(default):  # NOTE: where the default model was prepared; never fetched here
        smol = load_tokenizer(default)
        assert detect(smol, len(smol)) is None


# ---- the ids fed ---------------------------------------------------------------------------


def test_prompt_is_prefix_suffix_middle(make_engine: EngineFactory,
                                        fim_tokenizer: PreTrainedTokenizerBase) -> None:
    engine = _engine(make_engine, fim_tokenizer)
    [ids] = tokenize_completion(engine, (PREFIX,), SUFFIX)
    assert ids == _expected(fim_tokenizer, PREFIX, SUFFIX)
    assert fim_tokenizer.decode(ids) == f"<fim_prefix>{PREFIX}<fim_suffix>{SUFFIX}<fim_middle>"


def test_bos_comes_first_when_the_tokenizer_adds_one(
        make_engine: EngineFactory, bos_fim_tokenizer: PreTrainedTokenizerBase) -> None:
    engine = _engine(make_engine, bos_fim_tokenizer)
    assert engine.fim is not None and engine.fim.bos_ids == (bos_fim_tokenizer.bos_token_id,)
    [ids] = tokenize_completion(engine, (PREFIX,), SUFFIX)
    assert ids == _expected(bos_fim_tokenizer, PREFIX, SUFFIX,
                            bos=(bos_fim_tokenizer.bos_token_id,))
    assert ids.count(bos_fim_tokenizer.bos_token_id) == 1


def test_each_prompt_gets_the_suffix_and_ids_are_the_prefix(
        make_engine: EngineFactory, fim_tokenizer: PreTrainedTokenizerBase) -> None:
    engine = _engine(make_engine, fim_tokenizer)
    prefix_ids = tuple(fim_tokenizer.encode("x = ", add_special_tokens=False))
    out = tokenize_completion(engine, ("a", "", prefix_ids), SUFFIX)
    assert out == [_expected(fim_tokenizer, "a", SUFFIX), _expected(fim_tokenizer, "", SUFFIX),
                   _expected(fim_tokenizer, "x = ", SUFFIX)]


def _sentencepiece_like(legacy: bool) -> PreTrainedTokenizerBase:
    """A Llama-style tokenizer that puts a dummy "▁" before the text, with CodeLlama's tokens:
    by a `Prepend` normalizer (`legacy`) or a `Metaspace` pre-tokenizer."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    if legacy:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                               normalizers.Replace(" ", "▁")])
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    tok.decoder = decoders.Metaspace()
    t = KNOWN_FIM["codellama"]
    tok.train_from_iterator(corpus(300), trainer=trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<unk>", "<s>", t.prefix, t.suffix, t.middle],
        show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", unk_token="<unk>")


@pytest.mark.parametrize("legacy", [True, False])
def test_codellama_suffix_has_no_dummy_space(legacy: bool) -> None:
    tok = _sentencepiece_like(legacy)
    engine = _engine(EngineFactory(tok, word_ids=(2,)), tok)
    assert engine.fim is not None and engine.fim.name == "codellama"
    prefix, suffix = "if x", "return x"
    [ids] = tokenize_completion(engine, (prefix,), suffix)
    pieces = tok.convert_ids_to_tokens(ids)
    # NOTE: CodeLlama's "<PRE> {pre} <SUF>{suf} <MID>": the prefix keeps its dummy space
    assert pieces[:2] == ["<s>", "▁<PRE>"] and pieces[-1] == "▁<MID>"
    cut = pieces.index("▁<SUF>")
    assert "".join(pieces[2:cut]) == "▁if▁x"
    assert "".join(pieces[cut + 1:-1]) == "return▁x"


# ---- the config ------------------------------------------------------------------------------


def test_fim_setting_forms() -> None:
    assert parse_fim_setting("auto") == "auto" and parse_fim_setting("none") == "none"
    assert parse_fim_setting("codellama") == "codellama"
    tokens = FimTokens("<p>", "<s>", "<m>")
    assert parse_fim_setting("<p>,<s>,<m>") == tokens
    assert parse_fim_setting(["<p>", "<s>", "<m>"]) == tokens
    assert parse_fim_setting({"prefix": "<p>", "suffix": "<s>", "middle": "<m>"}) == tokens
    for bad in ("starcoder3", "<p>,<s>", ["<p>", "", "<m>"], {"prefix": "<p>"}, 3):
        with pytest.raises(ValueError):
            parse_fim_setting(bad)


def test_config_file_and_flag(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("model:\n  fim: {prefix: <p>, suffix: <s>, middle: <m>}\n")
    assert load_config(path).model.fim == FimTokens("<p>", "<s>", "<m>")
    assert load_config(path, {"model.fim": "none"}).model.fim == "none"
    args = build_parser().parse_args(["serve", "--fim", "deepseek-coder"])
    assert config_from_args(args).model.fim == "deepseek-coder"
    with pytest.raises(ConfigError, match="model.fim"):
        load_config(None, {"model.fim": "nope"})


def test_config_tokens_override_detection(fim_tokenizer: PreTrainedTokenizerBase) -> None:
    size = len(fim_tokenizer)
    # NOTE: any three single tokens will do; these three are the tiny model's chat tokens
    chat = FimTokens("<|im_start|>", "<|im_end|>", "<|endoftext|>")
    fim = resolve_fim(fim_tokenizer, chat, size)
    assert fim is not None and fim.name == "config"
    assert [fim.prefix_id, fim.suffix_id, fim.middle_id] == fim_tokenizer.convert_tokens_to_ids(
        [chat.prefix, chat.suffix, chat.middle])
    assert resolve_fim(fim_tokenizer, "none", size) is None
    with pytest.raises(ValueError, match=r"lacks <PRE>, <MID>"):
        resolve_fim(fim_tokenizer, FimTokens("<PRE>", "<|im_end|>", "<MID>"), size)
    with pytest.raises(ValueError, match="▁<PRE>"):
        resolve_fim(fim_tokenizer, "codellama", size)


# ---- through the app -------------------------------------------------------------------------


@session_loop
async def test_no_fim_tokens_is_a_400_naming_them(gateway: Harness) -> None:
    response = await gateway.client.post("/v1/completions", json={
        "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 4})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "suffix" and error["code"] == "unsupported_parameter"
    assert error["type"] == "invalid_request_error"
    assert "no fill-in-the-middle tokens" in error["message"]
    for tokens in KNOWN_FIM.values():
        assert str(tokens) in error["message"]
    # "" and null mean no suffix, as before
    for empty in ("", None):
        ok = await gateway.client.post("/v1/completions", json={
            "prompt": PREFIX, "suffix": empty, "max_tokens": 2})
        assert ok.status_code == 200, ok.text


def test_fim_turned_off_says_so(make_engine: EngineFactory,
                                fim_tokenizer: PreTrainedTokenizerBase) -> None:
    engine = _engine(make_engine, fim_tokenizer, fim="none")
    with pytest.raises(ApiError, match=r"turned off .* \(model.fim: none\)") as info:
        tokenize_completion(engine, (PREFIX,), SUFFIX)
    assert info.value.param == "suffix" and info.value.code == "unsupported_parameter"


@session_loop
async def test_usage_counts_the_ids_fed(fim_gateway: Harness, fed: list[list[int]],
                                        fim_tokenizer: PreTrainedTokenizerBase) -> None:
    response = await fim_gateway.client.post("/v1/completions", json={
        "prompt": [PREFIX, ""], "suffix": SUFFIX, "max_tokens": 3})
    assert response.status_code == 200, response.text
    expected = [_expected(fim_tokenizer, PREFIX, SUFFIX), _expected(fim_tokenizer, "", SUFFIX)]
    assert fed == expected
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] == sum(map(len, expected))
    assert usage["completion_tokens"] == 6
    echo = await fim_gateway.client.post("/v1/completions", json={
        "prompt": PREFIX, "suffix": SUFFIX, "echo": True})
    assert echo.status_code == 400 and echo.json()["error"]["param"] == "echo"


@session_loop
async def test_openai_client_streamed_and_not(fim_gateway: Harness,
                                              fed: list[list[int]]) -> None:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=fim_gateway.app))
    client = openai.AsyncOpenAI(base_url="http://gateway/v1", api_key="none", max_retries=0,
                                http_client=http)
    async with client:
        whole = await client.completions.create(model="tiny", prompt=PREFIX, suffix=SUFFIX,
                                                max_tokens=5, seed=7)
        stream = await client.completions.create(model="tiny", prompt=PREFIX, suffix=SUFFIX,
                                                 max_tokens=5, seed=7, stream=True,
                                                 stream_options={"include_usage": True})
        chunks = [chunk async for chunk in stream]
    assert whole.choices[0].text and whole.choices[0].finish_reason == "length"
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert whole.usage is not None and chunks[-1].usage == whole.usage
    assert fed[0] == fed[1] and whole.usage.prompt_tokens == len(fed[0])


@session_loop
async def test_a_batch_line_with_a_suffix_is_fed_the_fim_prompt(
        make_engine: EngineFactory, fim_tokenizer: PreTrainedTokenizerBase) -> None:
    async with running(auth_config(), _engine(make_engine, fim_tokenizer)) as h:
        seen: list[list[int]] = []
        submit = h.fake.submit

        def spy(request: Request) -> Any:
            seen.append(list(request.prompt_token_ids))
            return submit(request)

        h.fake.submit = spy  # type: ignore[method-assign]
        lines = [batch_line(0, COMPLETIONS, prompt=PREFIX, suffix=SUFFIX, max_tokens=3)]
        key = "sk-nightly-1"
        done = await wait_for(h.client, key, (await submit_batch(h.client, key, lines,
                                                                 COMPLETIONS))["id"])
        [out] = await results(h.client, key, done["output_file_id"])
    assert seen == [_expected(fim_tokenizer, PREFIX, SUFFIX)]
    assert out["response"]["body"]["usage"]["prompt_tokens"] == len(seen[0])

