//! Model configs, weight loading (HF safetensors, GGUF) and one forward-pass builder per architecture.
