// Package model runs Llama-family checkpoints on the CPU for questrt: it
// loads Hugging Face checkpoints (config.json and safetensors, single file
// or sharded, F32/F16/BF16 converted to float32, mapped rather than read),
// tokenizes (the byte tokenizer of the passkey test models), runs the
// decoder in float32 and samples.
//
// Attention goes through one small interface, [Attention], with
// implementations over the in-process engine ([EngineAttention]: dense
// prefill that fills the engine's KV pages, then decode steps with the
// runtime's Quest page selection, on post-RoPE keys), a fast dense float32
// cache ([Dense]) and a naive float64 reference ([Reference]) for tests.
package model
