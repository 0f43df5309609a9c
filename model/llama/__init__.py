"""The Llama-shaped families (Llama, Mistral, Qwen2/2.5, Qwen3): one folder.

config.py (data: sections, presets, axis rules), model.py (the decoder), flops.py (hand-counted FLOPs),
hf.py (Hugging Face adapters), family.py (the registrations). Importing the package itself loads nothing.
"""
