"""LoRA adapters: read from PEFT folders, served beside the base model in one batch."""

from models.lora.adapter import AdapterError, LoraAdapter, LoraWeights, load_peft_adapter
from models.lora.registry import AdapterSet
from models.lora.stack import LoraRows, LoraStack

__all__ = ["AdapterError", "AdapterSet", "LoraAdapter", "LoraRows", "LoraStack",
           "LoraWeights", "load_peft_adapter"]
