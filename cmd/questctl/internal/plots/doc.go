// Package plots draws PNG figures from the JSON lines that questctl
// prints, with gonum.org/v1/plot. It does no file I/O: [Data.Read] takes
// the lines from an io.Reader, [Passkey] and [Attention] build a [Figure]
// from records, and [Figure.WritePNG] writes the image to an io.Writer.
//
// Two kinds of input are understood ([Kind]):
//
//   - `questctl eval passkey --json` lines ([eval.Record]). One PNG with,
//     side by side, (i) accuracy (free-running greedy) against the token
//     budget on a log2 axis, one line per (selector, length): colour for
//     the selector, marker and dash for the length, with the dense
//     baseline of each length as a horizontal dashed grey line; and (ii)
//     a grid of attention-mass recall per layer, one row per length and
//     one column per selector, one line per budget (darker: larger), the
//     teacher-forced numbers where a record has them and the free-running
//     ones otherwise, the policy's dense layers shaded. Records of a task
//     with an in-page offset (reversal) count each (length, offset) as a
//     length. The legends sit beside the panels, so no data are hidden. A
//     file without diagnostics (no mass recall) gives the accuracy panel
//     alone.
//
//   - `questctl bench attention --json` lines ([AttentionRow]): step time
//     against context length, log-log, one panel per (batch, budget) (and
//     per backend, dtype and geometry when a file mixes them), with a line
//     for each timing the lines carry: dense, the Quest step as served,
//     the three-call step, and its score, top-K and sparse-attention
//     phases. All panels share the context axis, and the panels of a row
//     (one batch) their time axis.
//
// When the same configuration appears twice (two files of one sweep), the
// later line wins.
package plots
