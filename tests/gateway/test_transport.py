"""CORS and TLS: preflights and simple requests through the app, HTTPS and mutual TLS on the
real uvicorn server with certificates made here, and clear start-up errors for bad files."""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import ssl
from pathlib import Path

import httpx
import openai
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gateway.__main__ import build_parser, config_from_args, main
from gateway.config import ConfigError, GatewayConfig, load_config
from gateway.transport import CorsSettings, TlsSettings
from tests.gateway.harness import EngineFactory, auth_config, live_server, make_config, running

pytestmark = pytest.mark.asyncio(loop_scope="session")

ORIGIN = "https://app.example.com"


# ---- certificates ----------------------------------------------------------------------------


@dataclasses.dataclass
class Pki:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def client_context(self, with_cert: bool = False) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        if with_cert:
            context.load_cert_chain(self.client_cert, self.client_key)
        return context


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _issue(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
           issuer_key: ec.EllipticCurvePrivateKey, ca: bool = False) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if ca:
        builder = builder.add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
        builder = builder.add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    else:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
        builder = builder.add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
            issuer_key.public_key()), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey | None) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        path.with_suffix(".key").write_bytes(key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
    return path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    tmp = tmp_path_factory.mktemp("pki")
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _issue("slicegate test CA", ca_key, _name("slicegate test CA"), ca_key, ca=True)
    keys = {n: ec.generate_private_key(ec.SECP256R1()) for n in ("server", "client")}
    certs = {n: _write(tmp / f"{n}.pem", _issue(n, k, ca.subject, ca_key), k)
             for n, k in keys.items()}
    return Pki(_write(tmp / "ca.pem", ca, None), certs["server"],
               certs["server"].with_suffix(".key"), certs["client"],
               certs["client"].with_suffix(".key"))


def _tls(pki: Pki, **extra: object) -> TlsSettings:
    return TlsSettings(ssl_keyfile=str(pki.server_key), ssl_certfile=str(pki.server_cert),
                       **extra)  # type: ignore[arg-type]


# ---- TLS on the real server ------------------------------------------------------------------


async def test_the_openai_client_over_https(make_engine: EngineFactory, pki: Pki) -> None:
    config = dataclasses.replace(make_config(), tls=_tls(pki),
                                 cors=CorsSettings(allowed_origins=[ORIGIN]))
    with live_server(config, make_engine()) as server:
        assert server.url.startswith("https://")
        http = httpx.AsyncClient(verify=pki.client_context())
        async with openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="none",
                                      max_retries=0, http_client=http) as client:
            done = await client.completions.create(model="tiny", prompt="hello", max_tokens=4)
            assert done.usage is not None and done.usage.completion_tokens == 4
            stream = await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                stream=True)
            assert len([c async for c in stream if c.choices and c.choices[0].delta.content])
            raw = await client.models.with_raw_response.list(extra_headers={"Origin": ORIGIN})
            assert raw.headers["access-control-allow-origin"] == ORIGIN  # CORS over HTTPS
        async with httpx.AsyncClient() as untrusting:  # the system CAs do not know ours
            with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                await untrusting.get(f"{server.url}/health")
        async with httpx.AsyncClient() as plain:
            with pytest.raises(httpx.TransportError):  # plain HTTP to the HTTPS port
                await plain.get(server.url.replace("https://", "http://") + "/health")


async def test_mutual_tls_refuses_a_client_without_a_certificate(make_engine: EngineFactory,
                                                                 pki: Pki) -> None:
    tls = _tls(pki, ssl_ca_certs=str(pki.ca), ssl_cert_reqs=2)
    with live_server(dataclasses.replace(make_config(), tls=tls), make_engine()) as server:
        async with httpx.AsyncClient(verify=pki.client_context(with_cert=True)) as client:
            assert (await client.get(f"{server.url}/health")).status_code == 200
        async with httpx.AsyncClient(verify=pki.client_context()) as client:
            with pytest.raises(httpx.TransportError):  # refused at the handshake
                await client.get(f"{server.url}/health")


async def test_bad_tls_settings_fail_the_start_naming_the_file(pki: Pki, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]
                                                               ) -> None:
    key, cert = str(pki.server_key), str(pki.server_cert)
    missing = str(tmp_path / "nope.pem")
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    cases = [
        ({"tls.ssl_keyfile": missing, "tls.ssl_certfile": cert}, f"cannot read {missing}"),
        ({"tls.ssl_keyfile": key, "tls.ssl_certfile": str(garbage)}, "tls.ssl_certfile: cannot"
                                                                     " use"),
        ({"tls.ssl_keyfile": str(pki.client_key), "tls.ssl_certfile": cert}, "cannot use"),
        ({"tls.ssl_keyfile": key}, "needs both --ssl-keyfile and --ssl-certfile"),
        ({"tls.ssl_keyfile": key, "tls.ssl_certfile": cert, "tls.ssl_cert_reqs": 2},
         "needs --ssl-ca-certs"),
        ({"tls.ssl_keyfile": key, "tls.ssl_certfile": cert, "tls.ssl_cert_reqs": 3},
         "tls.ssl_cert_reqs"),
        ({"tls.ssl_keyfile": key, "tls.ssl_certfile": cert, "tls.ssl_ca_certs": str(garbage)},
         "cannot read CA certificates"),
        ({"tls.ssl_ca_certs": str(pki.ca)}, "client certificates need HTTPS"),
    ]
    for overrides, message in cases:
        with pytest.raises(ConfigError, match=message):
            load_config(None, overrides)
    # from the command line: exit status 2 and the message, before any model loads
    assert main(["serve", "--model", "no-such-model", "--ssl-keyfile", missing,
                 "--ssl-certfile", cert]) == 2
    assert f"error: tls.ssl_keyfile: cannot read {missing}" in capsys.readouterr().err


# ---- CORS ------------------------------------------------------------------------------------


def _cors(**cors: object) -> GatewayConfig:
    return dataclasses.replace(auth_config(), cors=CorsSettings(**cors))  # type: ignore[arg-type]


async def test_a_preflight_is_answered_for_an_allowed_origin(make_engine: EngineFactory) -> None:
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    async with running(_cors(allowed_origins=[ORIGIN]), make_engine()) as h:
        ok = await h.client.options("/v1/chat/completions", headers=preflight)
        assert ok.status_code == 200, ok.text
        assert ok.headers["access-control-allow-origin"] == ORIGIN
        assert "POST" in ok.headers["access-control-allow-methods"]
        assert "authorization" in ok.headers["access-control-allow-headers"].lower()
        other = await h.client.options("/v1/chat/completions",
                                       headers={**preflight, "Origin": "https://evil.example"})
        assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
    methods = _cors(allowed_origins=["*"], allowed_methods='["GET"]')
    async with running(methods, make_engine()) as h:
        refused = await h.client.options("/v1/chat/completions", headers=preflight)
        assert refused.status_code == 400 and "Disallowed CORS method" in refused.text


async def test_a_simple_request_and_its_errors_carry_cors_headers(
        make_engine: EngineFactory) -> None:
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
    async with running(_cors(allowed_origins=[ORIGIN], allow_credentials=True),
                       make_engine()) as h:
        ok = await h.client.post("/v1/completions", json=body, headers={
            "Origin": ORIGIN, "Authorization": "Bearer sk-ide-1"})
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == ORIGIN
        assert ok.headers["access-control-allow-credentials"] == "true"
        denied = await h.client.post("/v1/completions", json=body, headers={"Origin": ORIGIN})
        assert denied.status_code == 401  # a browser can read why
        assert denied.headers["access-control-allow-origin"] == ORIGIN
        evil = await h.client.post("/v1/completions", json=body, headers={
            "Origin": "https://evil.example", "Authorization": "Bearer sk-ide-1"})
        assert "access-control-allow-origin" not in evil.headers


async def test_no_cors_headers_by_default(make_engine: EngineFactory) -> None:
    async with running(auth_config(), make_engine()) as h:
        r = await h.client.get("/v1/models", headers={"Origin": ORIGIN,
                                                      "Authorization": "Bearer sk-ide-1"})
        assert r.status_code == 200
        assert not any(k.startswith("access-control-") for k in r.headers)
        preflight = await h.client.options("/v1/models", headers={
            "Origin": ORIGIN, "Access-Control-Request-Method": "GET"})
        assert "access-control-allow-origin" not in preflight.headers


async def test_cors_flags_take_json_lists_as_vllms() -> None:
    args = build_parser().parse_args(["serve", "--allowed-origins", f'["{ORIGIN}", "http://x"]',
                                      "--allowed-methods", '["GET", "POST"]',
                                      "--allowed-headers", '["authorization"]',
                                      "--allow-credentials"])
    cors = config_from_args(args).cors
    assert cors.allowed_origins == (ORIGIN, "http://x") and cors.allow_credentials
    assert (cors.allowed_methods, cors.allowed_headers) == (("GET", "POST"), ("authorization",))
    assert not config_from_args(build_parser().parse_args(["serve"])).cors.enabled
    for value, message in (("https://a.example", "expected a JSON list of strings"),
                           ('{"a": 1}', "expected a list of non-empty strings"),
                           ('[""]', "expected a list of non-empty strings")):
        with pytest.raises(ConfigError, match=f"cors.allowed_origins: {message}"):
            load_config(None, {"cors.allowed_origins": value})


async def test_a_config_file_has_cors_and_tls_sections(pki: Pki, tmp_path: Path) -> None:
    path = tmp_path / "gateway.yaml"
    path.write_text(f"cors: {{allowed_origins: ['{ORIGIN}'], allow_credentials: true}}\n"
                    f"tls: {{ssl_keyfile: '{pki.server_key}', ssl_certfile: "
                    f"'{pki.server_cert}'}}\n")
    config = load_config(path)
    assert config.cors.allowed_origins == (ORIGIN,) and config.tls.enabled
    assert config.tls.uvicorn_options()["ssl_certfile"] == str(pki.server_cert)
    path.write_text("tls: {ssl_password: x}\n")
    with pytest.raises(ConfigError, match="tls: unknown key"):
        load_config(path)
