//go:build !amd64 || purego

package model

func scores(q, k []float32, stride int, scale float32, out []float32) float32 {
	return scoresGeneric(q, k, stride, scale, out)
}

func expSum(s []float32, m float32) float32 { return expSumGeneric(s, m) }

func accum(p, v []float32, stride int, acc []float32) { accumGeneric(p, v, stride, acc) }
