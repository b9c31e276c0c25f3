// Package eval measures what Quest page selection does to a real model's
// answers (notes 1.1, 2.2, 3.3): the passkey harness builds prompts in the
// format the test models were trained on (or reads them from a file),
// prefills each densely once, and decodes the answer with dense attention
// (the baseline: a failure there is the model's, not the selector's) and
// with every (selector, budget) on forks of the prefilled sequence, both
// free-running (accuracy) and teacher-forced on the dense answer (token
// agreement, logits KL). Every sparse step can be measured against dense
// attention on the same pages: per layer, recall of the dense top-R
// tokens and attention-mass recall 1 - eps; per layer and head, the
// output's cosine and relative L2 error; and pages read next to the byte
// model rho = 1/S + K/P.
package eval
