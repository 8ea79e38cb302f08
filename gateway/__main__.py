"""`python -m gateway serve ...` (or `slicegate serve ...`): the OpenAI-compatible server."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

from gateway.batches.service import DataDirBusy, check_data_dir
from gateway.config import (
    DTYPES,
    KV_ADMISSIONS,
    POLICIES,
    PROVISIONING,
    ConfigError,
    GatewayConfig,
    load_config,
)
from gateway.engine import build_engine
from gateway.fim import KNOWN_FIM
from gateway.logs import LOG_FORMATS, LOG_LEVELS, configure_logging
from gateway.lora import AdapterStartupError
from gateway.server import serve
from gateway.tenants import TenantsFileError
from gateway.tools.formats import KNOWN_FORMATS
from gateway.tracing.setup import TracingUnavailable, check_tracing
from gateway.transport import OVERRIDES as TRANSPORT_OVERRIDES
from gateway.transport import add_arguments as add_transport_arguments
from models.cpu import keep_threads

# flag dest -> config key (`section.field`)
_OVERRIDES = {
    "served_model_name": "model.served_model_name",
    "dtype": "model.dtype", "max_model_len": "model.max_model_len",
    "generation_config": "model.generation_config", "fim": "model.fim",
    "tool_parser": "model.tool_parser", "lora_reserve_gib": "model.lora_reserve_gib",
    "speculative_config": "model.speculative_config",
    "layers_per_group": "model.layers_per_group", "layer_groups": "model.layer_groups",
    "devices": "scheduler.devices", "device_memory_gib": "scheduler.device_memory_gib",
    "cpu_threads": "scheduler.cpu_threads",
    "policy": "scheduler.policy", "kv_cache_gib": "scheduler.kv_cache_gib",
    "swap_space_gib": "scheduler.swap_space_gib", "kv_admission": "scheduler.kv_admission",
    "prefix_cache": "scheduler.prefix_cache", "reprofile": "scheduler.reprofile",
    "wide_prefill": "scheduler.wide_prefill",
    "max_queued_requests": "scheduler.max_queued_requests",
    "max_queued_tokens": "scheduler.max_queued_tokens",
    "max_low_wait_s": "scheduler.max_low_wait_s", "fault_rate": "scheduler.fault_rate",
    "ray_address": "scheduler.ray_address",
    "provisioning": "scheduler.provisioning",
    "provision_interval_s": "scheduler.provision_interval_s",
    "max_num_batched_tokens": "scheduler.max_batch_tokens",
    "tenants": "tenants_file", "host": "server.host",
    "port": "server.port", "drain_timeout": "server.drain_timeout_s",
    "request_timeout": "server.request_timeout_s", "log_level": "server.log_level",
    "log_format": "server.log_format",
    "data_dir": "batch.data_dir", "otlp_traces_endpoint": "server.otlp_traces_endpoint",
    **TRANSPORT_OVERRIDES,  # CORS and TLS
}


def build_parser() -> argparse.ArgumentParser:
    # NOTE: one CLI, two names: the `slicegate` console script and `python -m gateway`
    prog = "slicegate" if os.path.basename(sys.argv[0]) == "slicegate" else "python -m gateway"
    parser = argparse.ArgumentParser(prog=prog,
                                     description="slicegate: OpenAI-compatible LLM gateway")
    commands = parser.add_subparsers(dest="command", required=True)
    s = commands.add_parser("serve", help="run the HTTP server")
    s.add_argument("--config", help="YAML or TOML config file (flags override it)")
    s.add_argument("--model", action="append",
                   help="model spec: 'default', a folder or a hub id; or "
                        "NAME=SPEC[@DEVICE,...][,dtype=D][,kv_share=S], repeated, for several "
                        "models in one server (docs/models.md)")
    s.add_argument("--served-model-name", help="the model name clients send")
    s.add_argument("--dtype", choices=DTYPES)
    s.add_argument("--max-model-len", type=int, help="context limit in tokens")
    s.add_argument("--generation-config", metavar="auto|none|DIR",
                   help="sampling defaults for what requests omit: the model folder's "
                        "generation_config.json (auto, the default), none, or DIR's")
    s.add_argument("--fim", metavar="auto|none|NAME|PREFIX,SUFFIX,MIDDLE",
                   help="fill-in-the-middle tokens for `suffix`: a known set found in the "
                        "vocabulary (auto, the default), none, a known set "
                        f"({', '.join(KNOWN_FIM)}) or the three tokens")
    s.add_argument("--tool-parser", choices=("auto", *KNOWN_FORMATS),
                   help="how tool calls are read from the output: from the chat template and "
                        "vocabulary (auto, the default) or a format")
    s.add_argument("--lora", action="append", metavar="NAME=PATH",
                   help="serve the PEFT LoRA adapter in folder PATH as model NAME (repeat it; "
                        "docs/lora.md)")
    s.add_argument("--lora-modules", nargs="+", action="extend", metavar="NAME=PATH",
                   help="vLLM's spelling of --lora: NAME=PATH ... (or its JSON form)")
    s.add_argument("--lora-reserve-gib", type=float,
                   help="memory kept on each device for adapters loaded at run time "
                        "(POST /v1/load_lora_adapter); default 0")
    s.add_argument("--speculative-config", metavar="JSON",
                   help="prompt-lookup speculative decoding, vLLM's flag: '{\"method\": "
                        "\"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4}'"
                        " (docs/speculation.md)")
    s.add_argument("--layers-per-group", type=int, metavar="N",
                   help="decoder layers per operator (default: the layers in 6 groups)")
    s.add_argument("--layer-groups", metavar="N,M",
                   help="operators of the largest size, and finer variant chains chosen per "
                        "plan where low work must fit between interactive steps, e.g. 2,10 "
                        "(docs/granularity.md)")
    s.add_argument("--max-num-batched-tokens", type=int, metavar="N",
                   help="prefill tokens in one plan; longer prompts run in chunks of N "
                        "(default 2048)")
    s.add_argument("--devices", help="e.g. cuda:0,cuda:1 (default: every GPU, else cpu:0,cpu:1);"
                                     " with --ray-address NODE/cpu:0,NODE/cuda:0 (NODE: an IP "
                                     "address, node id or custom resource) or ray:all (default)")
    s.add_argument("--ray-address", metavar="ADDRESS|auto",
                   help="serve from the devices of a Ray cluster (needs pip install '.[ray]')")
    s.add_argument("--device-memory-gib", type=float, help="memory budget per device")
    s.add_argument("--cpu-threads", type=int,
                   help="intra-op threads of each CPU device (default: the cores split between "
                        "the CPU devices; fewer leave cores to the server's own threads)")
    s.add_argument("--policy", choices=POLICIES)
    s.add_argument("--kv-cache-gib", type=float, help="KV cache per device (default: what the "
                                                      "memory budget leaves)")
    s.add_argument("--swap-space-gib", type=float,
                   help="host memory for preempted requests' KV (default 4; 0: recompute)")
    s.add_argument("--kv-admission", choices=KV_ADMISSIONS,
                   help="on-demand (default): reserve the prompt, grow per block; full: "
                        "reserve prompt + max_tokens at admission (the old rule, to compare)")
    s.add_argument("--prefix-cache", action=argparse.BooleanOptionalAction, default=None,
                   help="share the cached KV blocks of equal prompt prefixes between requests "
                        "(default on; --no-prefix-cache computes every prompt in full)")
    s.add_argument("--reprofile", action=argparse.BooleanOptionalAction, default=None,
                   help="time a device kind's ops again in the background when they drift "
                        "from their profile (default on; --no-reprofile: the online refit "
                        "alone follows the drift)")
    s.add_argument("--wide-prefill", action=argparse.BooleanOptionalAction, default=None,
                   help="let a long interactive prompt run its operators on the cores of two "
                        "CPU devices of this host at once (default on; --no-wide-prefill: "
                        "one device's threads per operator)")
    s.add_argument("--max-queued-requests", metavar="N|high=N,normal=N,low=N,total=N",
                   help="waiting requests per class and in all (beyond: shed, 503)")
    s.add_argument("--max-queued-tokens", metavar="N|high=N,normal=N,low=N,total=N",
                   help="waiting prompt tokens per class and in all (beyond: shed, 503)")
    s.add_argument("--max-low-wait-s", type=float,
                   help="age a low request into the normal class after this wait (default off)")
    s.add_argument("--fault-rate", type=float,
                   help="TESTING ONLY: fraction of operators made to fail (default 0)")
    s.add_argument("--provisioning", choices=PROVISIONING,
                   help="off (default: every device holds every operator), opscale (replicas "
                        "of single operators sized by queueing) or model (whole-model "
                        "replicas every 20 s by pending prompt tokens)")
    s.add_argument("--provision-interval-s", type=float,
                   help="seconds between opscale plans (default 1)")
    s.add_argument("--tenants", help="tenants file (YAML); without one, auth is off")
    s.add_argument("--host", help="bind address (default 127.0.0.1)")
    s.add_argument("--port", type=int, help="port (default 8000)")
    s.add_argument("--drain-timeout", type=float, help="SIGTERM: seconds to finish in-flight")
    s.add_argument("--request-timeout", type=float, help="total deadline of one request, s")
    s.add_argument("--log-level", choices=LOG_LEVELS)
    s.add_argument("--log-format", choices=LOG_FORMATS,
                   help="text (default): TIME LEVEL LOGGER: MESSAGE; json: one object a line")
    s.add_argument("--otlp-traces-endpoint", metavar="URL",
                   help="export a span per request over OTLP (protocol: "
                        "$OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, default http/protobuf; needs "
                        "pip install '.[otel]')")
    s.add_argument("--data-dir", help="Batch API files and state (default: the user data dir, "
                                      "or $SLICEGATE_DATA_DIR)")
    add_transport_arguments(s)  # CORS and TLS
    return parser


def config_from_args(args: argparse.Namespace) -> GatewayConfig:
    overrides: dict[str, Any] = {key: getattr(args, dest) for dest, key in _OVERRIDES.items()
                                 if getattr(args, dest) is not None}
    if args.model and any("=" in m for m in args.model):
        overrides["model.models"] = list(args.model)
    elif args.model:
        overrides["model.spec"] = args.model[-1]
    if args.lora or args.lora_modules:  # NOTE: flags replace the config file's adapters
        overrides["model.lora"] = [*(args.lora or ()), *(args.lora_modules or ())]
    if args.ray_address is not None and args.devices is None:
        overrides["scheduler.devices"] = "ray:all"  # NOTE: a cluster's default: all of it
    return load_config(args.config, overrides)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except (ConfigError, TenantsFileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        check_data_dir(config.batch.resolved_data_dir)  # before minutes of model loading
        if config.server.otlp_traces_endpoint is not None:
            check_tracing(config.server.otlp_traces_endpoint)
    except (DataDirBusy, OSError, TracingUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    configure_logging(config.server.log_level, config.server.log_format)
    # NOTE: this thread runs the event loop: at one intra-op thread its torch calls never
    # start an OpenMP team beside the executors' (see `models.cpu.in_own_thread`)
    keep_threads(1)
    try:
        engine = build_engine(config)
    except AdapterStartupError as exc:  # like a bad flag: the adapter named is at fault
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as exc:  # a bad model spec, device list or budget
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return serve(config, engine)


if __name__ == "__main__":
    sys.exit(main())
