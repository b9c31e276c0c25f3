package model

import "github.com/questrt/questrt/kernels"

// The vector loops and the exponential of the prefill attention live in
// package kernels (beside its other AVX2 loops); the model's tests and
// benchmarks reach them under their former names.

func scores(q, k []float32, stride int, scale float32, out []float32) float32 {
	return kernels.ScoreRows(q, k, stride, scale, out)
}

func expSum(s []float32, m float32) float32 { return kernels.ExpSum(s, m) }

func accum(p, v []float32, stride int, acc []float32) { kernels.AccumRows(p, v, stride, acc) }

func expNeg(x float32) float32 { return kernels.ExpNeg(x) }
