// Package gpudecode is the benchmark behind `questctl bench decode`: the
// device executor (model/gpu) decoding over sequences that already hold
// a context of random K/V (made on the device and appended through the
// engine's device path, no prefill), Warmup + Steps greedy steps of a
// batch of them, Quest then every layer dense, continuing the same
// sequences (Measure); a marked step's device timeline per phase and
// the projections' streaming rate (Config.Phases); a profiler range
// around one warm-up step (Config.Profile); and the time to first token
// of random prompts through the executor's device prefill
// (MeasurePrefill). Run is the whole command on a device the caller
// owns: the weights (a checkpoint or random), the measurements and the
// prefill lines, one JSON line each, with the fields of the PyTorch
// anchor's lines (../shared/anchors/llama_decode_anchor.py). The CLI
// keeps the flags, their checks and the help text; the executor and the
// hooks the benchmark reads (timings, phase marks, step statistics)
// stay in model/gpu.
package gpudecode
