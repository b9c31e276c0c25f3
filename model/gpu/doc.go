// Package gpu is the device executor of Llama-family models: the decoder
// of package model (embedding, RMSNorm, the q/k/v/o and MLP projections,
// RoPE, SwiGLU, the LM head and greedy sampling) on a device, with
// attention through the step seam (decode.Stepper) on device tensors, so
// that a token's activations never leave the device: two host
// synchronisations per token (the Stepper's End and the argmax), none
// per layer.
//
// It runs on a kernels.ModelDevice: the CUDA backend (kernels/cuda, build
// tag cuda) that also holds the sequences' pages (an in-process engine of
// one rank on that backend, DeviceResident), so that its tensors and the
// attention share one context and one stream; or the CPU twin of a device
// (kernels/backendtest.QueuedDevice), on which its scheduling and
// bookkeeping run in CI against the CPU executor.
//
// Built: decode steps of a batch of sequences (greedy), the weights in
// float32 or bf16 uploaded from a model.Model (q|k|v and gate|up fused
// into one matrix each) or random (NewRandom). Not built yet: prefill on
// the device (the prompt is prefilled by the CPU executor into the same
// engine), sampling other than greedy on the device, CUDA graphs.
package gpu
