package kernels

import (
	"context"

	"github.com/questrt/questrt/decode"
	"github.com/questrt/questrt/plan"
)

// Matrix is a weight matrix [Rows][Cols] in a device's memory, stored as
// DType (plan.Float32 or plan.BFloat16): the handle a ModelDevice gives
// out and takes back. The zero Matrix holds nothing.
type Matrix struct {
	// Ptr is the device address of element [0][0].
	Ptr        uintptr
	Rows, Cols int
	DType      plan.DType
}

// Bytes is the matrix's size in device memory.
func (m Matrix) Bytes() int64 { return int64(m.Rows) * int64(m.Cols) * int64(m.DType.Bytes()) }

// ModelDevice is what a model executor runs on besides attention (model/gpu):
// device tensors of float32 activations, weight matrices, and the
// decoder's operations, each queued in order on the device's stream (the
// stream its TensorStepper orders attention on) and returning before it
// ran, except Argmax, Sample and DownloadTensor, which wait. Bad shapes are
// refused before anything is queued. Two implementations: the CUDA
// backend (kernels/cuda) and its CPU twin (backendtest.QueuedDevice),
// which runs the same operations in float on the host so that an
// executor's scheduling and bookkeeping run in CI.
type ModelDevice interface {
	// Device is the device whose memory the tensors live in.
	Device() decode.Device
	// MemInfo returns the device memory free now and in all, in bytes.
	MemInfo(ctx context.Context) (free, total int64, err error)
	// AllocTensor allocates n floats; FreeTensor frees a whole
	// allocation.
	AllocTensor(n int) (decode.Tensor, error)
	FreeTensor(t decode.Tensor) error
	// UploadTensor copies src into t after the work queued so far;
	// DownloadTensor waits for the queued work and copies t out.
	UploadTensor(t decode.Tensor, src []float32) error
	DownloadTensor(ctx context.Context, t decode.Tensor) ([]float32, error)
	// UploadMatrix copies w ([rows][cols]) to the device as dt;
	// RandomMatrix fills one with offset + scale * u, u uniform in
	// [-1, 1) from a hash of (seed, index) made on the device.
	UploadMatrix(ctx context.Context, w []float32, rows, cols int, dt plan.DType) (Matrix, error)
	RandomMatrix(ctx context.Context, rows, cols int, dt plan.DType, seed uint64, scale, offset float32) (Matrix, error)
	FreeMatrix(ctx context.Context, m Matrix) error
	// Embed writes the rows of table that ids name into out.
	Embed(ctx context.Context, out decode.Tensor, table Matrix, ids []int32) error
	// RMSNorm writes x ([rows][H]) normalised and scaled by w into out
	// (which may be x).
	RMSNorm(ctx context.Context, out, x decode.Tensor, w Matrix, rows int, eps float32) error
	// Gemv writes y = x w^T (+ res, which may be y itself) for rows rows.
	// With bf16 weights and many rows (a prompt chunk) a device may round
	// x (normalised, for GemvNorm) to bf16 and run a tensor-core GEMM;
	// the sums stay in float32.
	Gemv(ctx context.Context, y decode.Tensor, w Matrix, x, res decode.Tensor, rows int) error
	// GemvSplit writes x w^T into up to three outputs, each taking the
	// next ys[i].Len/rows outputs of every row (fused q|k|v, gate|up).
	GemvSplit(ctx context.Context, w Matrix, x decode.Tensor, rows int, ys ...decode.Tensor) error
	// GemvNorm is GemvSplit of x normalised as RMSNorm does with the
	// weights norm (1 x w.Cols, of w's type) and eps, without storing the
	// normalised x (the CUDA backend fuses the two into one launch).
	GemvNorm(ctx context.Context, w Matrix, x decode.Tensor, norm Matrix, eps float32, rows int, ys ...decode.Tensor) error
	// Rope rotates q ([rows][qh][d]) and k ([rows][kh][d]; the zero
	// Tensor with kh 0 for none) in place by the angles whose cosines and
	// sines cs holds ([rows][d/2][2]).
	Rope(ctx context.Context, q, k decode.Tensor, rows, qh, kh, d int, cs decode.Tensor) error
	// SiluMul sets g = silu(g) * u elementwise.
	SiluMul(ctx context.Context, g, u decode.Tensor) error
	// Argmax waits for the queued work and returns, per row of logits
	// ([rows][vocab]), the first index of its largest value (0 for a
	// row without one: NaN or -inf throughout).
	Argmax(ctx context.Context, logits decode.Tensor, rows, vocab int) ([]int32, error)
	// Sample waits for the queued work and returns, per row of logits
	// ([rows][vocab]), the token that SampleRow picks with that row's
	// parameters (len(params) == rows; a greedy row is its Argmax), and
	// every row's Argmax (what serving records beside a sampled token).
	// Parameters out of range are refused before anything runs.
	Sample(ctx context.Context, logits decode.Tensor, rows, vocab int, params []SampleParams) (ids, greedy []int32, err error)
}
