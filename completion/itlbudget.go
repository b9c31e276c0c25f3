package completion

import (
	"math"
	"time"
)

// itlBudget sizes the prefill of a scheduler iteration so that the
// iteration, its prefill and the decode step of the running sequences
// together, takes about Config.MaxITLFactor times the decode step alone
// (the running streams' inter-token latency while a prompt prefills).
//
// It learns the costs from what the scheduler measured: the decode
// step's time (an exponentially weighted moving average) and a prompt
// chunk's prefill time as a fixed cost F per chunk plus a line per
// token in the context it is prefilled at, a + b*context (the dense
// prefill attention reads the whole context), fitted by exponentially
// weighted least squares over the recent chunks. A chunk of n tokens
// starting at context c then costs F + n*(a + b*(c + (n-1)/2)). F is
// what a chunk costs whatever its tokens (every layer's weights read
// once, the kernels' start): on a 2-core CPU it is about the time of a
// decode step of a few streams (2026-12-07-prefill-chunk-cost-cpu.md),
// so that chunks of a token or two cost mostly F. F is fitted only
// while the recent chunks differ enough in their token counts (else it
// cannot be told from a), and its fits are averaged; in between the
// average holds (0 before any fit: the per-token line alone). A chunk is not run until its tokens'
// time is at least itlMinUseful times F (the allowance carries over),
// so that prefill beside decoding streams is not spent mostly on F.
//
// It is pure arithmetic on durations handed in: the scheduler owns the
// clock, and tests drive it with made-up costs. Not safe for
// concurrent use (the scheduler goroutine owns it).
type itlBudget struct {
	factor float64
	// decode is the moving average of the decode step, in seconds (0:
	// none measured yet).
	decode float64
	// The exponentially weighted sums of the prefill observations: x is
	// the mean context of a chunk's tokens, y its time per token in
	// seconds; w is the sum of the weights.
	w, sx, sy, sxx, sxy float64
	// The sums of u, 1/n of a chunk of n tokens (the share of F in its
	// time per token), for the fixed cost's fit.
	su, suu, sxu, suy float64
	// fixed is the fixed cost of a chunk, in seconds: the moving
	// average of its fits (itlFixedWeight), one for each chunk observed
	// while the recent chunks' token counts differed enough (0 before
	// any); fits counts them.
	fixed float64
	fits  int
	// perTokenOnly leaves the fixed cost out (hooks.perTokenOnly): the
	// per-token line absorbs it, and a chunk runs once a token fits.
	perTokenOnly bool
	// credit is the allowance, in seconds, of the iterations in a row
	// that prefilled nothing because one prompt token did not fit
	// (held): the next iteration may spend it, so that a token costlier
	// than one iteration's allowance runs once enough of them went by.
	credit float64
	// held counts those iterations.
	held int
}

const (
	// itlDecodeWeight is the weight of the newest decode step in the
	// moving average (about the last 5 steps count).
	itlDecodeWeight = 0.2
	// itlPrefillDecay is the factor that the prefill sums keep of the
	// older observations at each new one (about the last 10 chunks
	// count).
	itlPrefillDecay = 0.9
	// itlFloor is the least per-token cost the fitted line may predict,
	// as a share of the observations' mean (a line extrapolated below
	// the contexts it was fitted on must not promise free tokens).
	itlFloor = 0.05
	// itlMaxHeld is the most iterations in a row that may prefill
	// nothing while a prompt waits: the next one prefills a token
	// whatever its predicted cost (progress, even when the fitted costs
	// are wrong).
	itlMaxHeld = 16
	// itlMinUseful is the least time of a chunk's tokens, as a share of
	// the chunk's fixed cost, for it to run beside decoding streams
	// (unless forced): 1, at most half of a chunk's time is its fixed
	// cost.
	itlMinUseful = 1.0
	// itlFixedSpread is the least variance of 1/n over the recent chunks,
	// as a share of its squared mean, for the fixed cost to be fitted (1/n
	// must differ by about a tenth of its mean: chunks of 2 and 3 tokens
	// do, of 7 and 8 do not).
	itlFixedSpread = 0.01
	// itlMaxSpend is the most allowances of decode steps that a whole
	// chunk beside decoding streams may take (spending the credit of
	// the iterations held before it): when no chunk worth its fixed
	// cost (itlMinUseful) fits, the chunk's layers spread over the
	// iterations instead (split), so that an iteration's gap stays
	// near the factor's bound however large the fixed cost grows with
	// the context (2026-12-07-serve-32k-itl-2-cpu.md).
	itlMaxSpend = 3.0
	// itlSpreadShare is the allowances that a layer's share of a chunk
	// spread over iterations (split) takes: 2, an iteration that runs
	// one after one that held takes a decode step and 2 allowances (3
	// decode steps at factor 2), and the chunk is about twice the
	// tokens that one allowance a layer would give (its fixed cost a
	// smaller share of it).
	itlSpreadShare = 2.0
	// itlFixedWeight is the weight of the newest fit of the fixed cost
	// in its moving average: a chunk's time on a busy CPU is noisy, and
	// one fit over a few chunks of nearby token counts with it.
	itlFixedWeight = 0.2
)

// newITLBudget returns the budget for factor (Config.MaxITLFactor, at
// least 1).
func newITLBudget(factor float64) *itlBudget { return &itlBudget{factor: factor} }

// observeDecode records a decode step's time.
func (b *itlBudget) observeDecode(d time.Duration) {
	s := d.Seconds()
	if s <= 0 {
		return
	}
	if b.decode == 0 {
		b.decode = s
		return
	}
	b.decode += itlDecodeWeight * (s - b.decode)
}

// observePrefill records the time d of a prefill chunk of n tokens
// that started at context c (the tokens of the sequence before it).
func (b *itlBudget) observePrefill(c, n int, d time.Duration) {
	if n < 1 || d <= 0 {
		return
	}
	x := float64(c) + float64(n-1)/2 // the mean context of its tokens
	y := d.Seconds() / float64(n)
	u := 1 / float64(n)
	k := itlPrefillDecay
	b.w = k*b.w + 1
	b.sx = k*b.sx + x
	b.sy = k*b.sy + y
	b.sxx = k*b.sxx + x*x
	b.sxy = k*b.sxy + x*y
	b.su = k*b.su + u
	b.suu = k*b.suu + u*u
	b.sxu = k*b.sxu + x*u
	b.suy = k*b.suy + u*y
	if f, ok := b.fitFixed(); ok {
		if b.fits == 0 {
			b.fixed = f
		} else {
			b.fixed += itlFixedWeight * (f - b.fixed)
		}
		b.fits++
	}
}

// fitFixed fits the per-chunk cost F of y = a + b*x + F*u (y a chunk's
// time per token, x its mean context, u = 1/n) over the weighted
// observations; ok is false with fewer than 3 chunks' weight, when their
// 1/n do not spread enough to tell F from a (itlFixedSpread), or when
// 1/n and the context move together (no telling F from b). F is at least
// 0, and at most what leaves the mean per-token cost itlFloor of the
// mean.
func (b *itlBudget) fitFixed() (f float64, ok bool) {
	if b.w < 2.5 {
		return 0, false
	}
	mx, my, mu := b.sx/b.w, b.sy/b.w, b.su/b.w
	vu := b.suu/b.w - mu*mu
	if vu <= itlFixedSpread*mu*mu {
		return 0, false
	}
	vx := b.sxx/b.w - mx*mx
	cxu, cxy, cuy := b.sxu/b.w-mx*mu, b.sxy/b.w-mx*my, b.suy/b.w-mu*my
	f = cuy / vu // no spread of contexts: y = a' + F*u
	if vx > 1e-9*(1+mx*mx) {
		det := vx*vu - cxu*cxu
		if det <= 1e-6*vx*vu {
			return 0, false
		}
		if slope := (cxy*vu - cuy*cxu) / det; slope >= 0 {
			f = (cuy*vx - cxy*cxu) / det
		} // else the slope is clamped to 0 (line): F alone
	}
	if f < 1e-9 { // rounding's, or a cost falling with 1/n
		f = 0
	}
	return min(f, (1-itlFloor)*my/mu), true
}

// line returns the fitted per-token cost net of the chunks' fixed cost
// (b.fixed): mean context mx, mean cost my, slope (seconds per token
// per token of context, never negative), and whether there is any
// observation. With the observations at one context (no spread to fit
// a slope on) the slope is 0.
func (b *itlBudget) line() (mx, my, slope float64, ok bool) {
	if b.w == 0 {
		return 0, 0, 0, false
	}
	f := b.fixedCost()
	mx, my = b.sx/b.w, b.sy/b.w-f*b.su/b.w
	vx := b.sxx/b.w - mx*mx
	if vx > 1e-9*(1+mx*mx) {
		// The covariance of x with y - F*u.
		c := b.sxy/b.w - f*b.sxu/b.w - mx*my
		slope = max(0, c/vx)
	}
	return mx, my, slope, true
}

// fixedCost is the fixed cost of a chunk in seconds: the last fitted,
// at most what leaves the recent chunks' mean per-token cost itlFloor
// of their mean (a fit from older chunks must not make tokens free).
func (b *itlBudget) fixedCost() float64 {
	if b.perTokenOnly || b.fixed == 0 || b.su == 0 {
		return 0
	}
	return min(b.fixed, (1-itlFloor)*b.sy/b.su)
}

// perToken is the predicted prefill time of one token at context c, in
// seconds (ok false: nothing observed yet).
func (b *itlBudget) perToken(c float64) (float64, bool) {
	mx, my, slope, ok := b.line()
	if !ok {
		return 0, false
	}
	return max(my+slope*(c-mx), itlFloor*my), true
}

// allowance is the prefill time an iteration may spend beside a decode
// step, in seconds: (factor - 1) times the decode step. ok is false
// before any decode step was measured.
func (b *itlBudget) allowance() (float64, bool) {
	if b.decode == 0 {
		return 0, false
	}
	return (b.factor - 1) * b.decode, true
}

// tokens returns how many prompt tokens, starting at context c, fit
// time seconds of prefill by the fitted costs: the largest n with
// F + n*(p + slope*(n-1)/2) <= time, F the chunk's fixed cost and p the
// per-token cost at c; 0 when those tokens' time would be less than
// itlMinUseful times F (the caller holds and the time carries over).
// With no observation yet it returns 1 (a probe: its time is the first
// observation). The result is at least 0; callers cap it.
func (b *itlBudget) tokens(c int, time float64) int {
	_, _, slope, _ := b.line()
	p, ok := b.perToken(float64(c))
	if !ok {
		return 1
	}
	f := b.fixedCost()
	n := b.fit(c, time)
	if n < 1 || f > 0 && float64(n)*(p+slope*float64(n-1)/2) < itlMinUseful*f {
		return 0
	}
	return n
}

// fit returns the largest n whose chunk, starting at context c, takes
// at most time seconds by the fitted costs, F + n*(p + slope*(n-1)/2)
// (0 when not even one token fits; 1 with no observation yet), with no
// regard to what share of it F is (tokens' rule).
func (b *itlBudget) fit(c int, time float64) int {
	_, _, slope, _ := b.line()
	p, ok := b.perToken(float64(c))
	if !ok {
		return 1
	}
	time -= b.fixedCost()
	if time <= 0 {
		return 0
	}
	var n float64
	if slope == 0 {
		n = time / p
	} else {
		// slope/2 n^2 + (p - slope/2) n - time = 0, the positive root,
		// (-q + sqrt(q^2 + 2 slope time)) / slope written as
		// 2 time / (q + sqrt(...)): the first form cancels to 0 when
		// the slope is tiny beside q (a line fitted to costs flat in
		// the context, with rounding's slope), the second does not.
		q := p - slope/2
		n = 2 * time / (q + math.Sqrt(q*q+2*slope*time))
	}
	n = math.Floor(n * (1 + 1e-12)) // 2.9999999 from rounding is 3
	if n > 1<<30 {
		return 1 << 30
	}
	return int(max(0, n))
}

// split returns the tokens of a chunk starting at context c whose
// layers (layers of them) should run over the next iterations, a
// layer's share of its time in an iteration, when no whole chunk worth
// its fixed cost fits itlMaxSpend allowances: the tokens whose chunk
// takes layers x itlSpreadShare allowances (tokens' rule, the fixed
// cost included), or when none of those is worth the fixed cost, the
// tokens that fit them (at least 1); 0 otherwise (whole chunks, as
// tokens says), and without a fixed cost.
func (b *itlBudget) split(c int, allowance float64, layers int) int {
	if layers < 2 || allowance <= 0 || b.perTokenOnly || b.fixedCost() == 0 {
		return 0
	}
	if b.tokens(c, itlMaxSpend*allowance) > 0 {
		return 0
	}
	t := float64(layers) * itlSpreadShare * allowance
	if n := b.tokens(c, t); n > 0 {
		return n
	}
	// Not even layers allowances pay for tokens worth the fixed cost:
	// the tokens that fit them, one at least (a layer's share of it may
	// then wait for the credit of held iterations, a smaller gap than
	// the whole chunk's).
	return max(1, b.fit(c, t))
}

// cost is the predicted time of a chunk of n tokens starting at
// context c, its fixed cost included, in seconds (0 with no
// observation).
func (b *itlBudget) cost(c, n int) float64 {
	_, _, slope, _ := b.line()
	p, ok := b.perToken(float64(c))
	if !ok || n < 1 {
		return 0
	}
	return b.fixedCost() + float64(n)*(p+slope*float64(n-1)/2)
}

// hold records an iteration that prefilled nothing while a prompt
// waited, because not even one token fitted its allowance (seconds):
// the allowance goes to the credit.
func (b *itlBudget) hold(allowance float64) {
	b.credit += max(0, allowance)
	b.held++
}

// ran records an iteration that prefilled prompt tokens: the credit is
// spent.
func (b *itlBudget) ran() { b.credit, b.held = 0, 0 }

// mustRun reports whether the next iteration must prefill a token
// whatever it costs: itlMaxHeld iterations in a row prefilled nothing.
func (b *itlBudget) mustRun() bool { return b.held >= itlMaxHeld }
