"""Model runtime: operators over paged KV cache, loaded from transformers folders."""

from models.batch import Batch, BatchShape, SeqSpec, build_batch
from models.kv_cache import BlockAllocator, KVCache
from models.loader import Model, load
from models.sampling_params import SamplingParams
from models.template import GraphTemplate, OpKind, OpTemplate

__all__ = ["Batch", "BatchShape", "BlockAllocator", "GraphTemplate", "KVCache", "Model",
           "OpKind", "OpTemplate", "SamplingParams", "SeqSpec", "build_batch", "load"]
