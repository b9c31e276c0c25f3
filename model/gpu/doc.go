// Package gpu is the device executor of Llama-family models: the decoder
// of package model (embedding, RMSNorm, the q/k/v/o and MLP projections,
// RoPE, SwiGLU, the LM head and greedy sampling) on a CUDA device, with
// attention through the step seam (decode.Stepper) on device tensors, so
// that a token's activations never leave the GPU: one host
// synchronisation per token (its argmax), none per layer.
//
// The executor needs the cuda build tag (files built without it hold
// only this documentation). It runs its kernels through the
// kernels/cuda Backend that also holds the sequences' pages (an
// in-process engine of one rank on that backend, DeviceResident), so that
// its tensors and the attention share one context and one stream.
//
// Built: decode steps of a batch of sequences (greedy), the weights in
// float32 or bf16 uploaded from a model.Model. Not built yet: prefill on
// the device (the prompt is prefilled by the CPU executor into the same
// engine), sampling other than greedy, CUDA graphs, tensor-core GEMMs.
package gpu
