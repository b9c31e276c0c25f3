//go:build !amd64 || purego

package kernels

func dot(a, b []float32) float32          { return dotGeneric(a, b) }
func axpy(alpha float32, x, y []float32)  { axpyGeneric(alpha, x, y) }
func scaleVec(alpha float32, y []float32) { scaleGeneric(alpha, y) }

func dot4(q, k []float32, out *[4]float32) { dot4Generic(q, k, out) }
func gemvT(p, v, acc []float32)            { gemvTGeneric(p, v, acc) }

// ScoreRows sets out[t] = scale * q . k[t*stride:][:len(q)] for t < len(out)
// and returns their maximum (-inf when out is empty).
func ScoreRows(q, k []float32, stride int, scale float32, out []float32) float32 {
	return scoreRowsGeneric(q, k, stride, scale, out)
}

// ExpSum sets s[i] = e^(s[i]-m) (s[i] <= m) and returns their sum.
func ExpSum(s []float32, m float32) float32 { return expSumGeneric(s, m) }

// AccumRows does acc[j] += sum_t p[t] * v[t*stride+j] for j < len(acc).
func AccumRows(p, v []float32, stride int, acc []float32) { accumRowsGeneric(p, v, stride, acc) }
