package serveload

import (
	"fmt"
	"math/rand/v2"

	"github.com/questrt/questrt/eval"
)

// prompt is one request's prompt and the answer it should get.
type prompt struct {
	text, answer string
}

// passkeyPrompts makes n passkey prompts of about length bytes; prompt i
// depends on seed, i and length only.
func passkeyPrompts(seed uint64, stream uint64, n, length int) ([]prompt, error) {
	out := make([]prompt, n)
	for i := range out {
		p, err := eval.Passkey(rand.New(rand.NewPCG(seed, stream+uint64(i))), length, eval.PasskeyOptions{})
		if err != nil {
			return nil, err
		}
		out[i] = prompt{text: p.Text(), answer: p.Answer}
	}
	return out, nil
}

// sharedPrompts makes the n prompts of a shared-prefix level: groups
// passkey documents of about length bytes (document g depends on seed,
// stream + g and length only, and starts with its own "Document" line),
// prompt i document i mod groups followed by its own question, whose
// answer is that document's passkey.
func sharedPrompts(seed, stream uint64, n, groups, length int) ([]prompt, error) {
	docs := make([]eval.Prompt, min(groups, n))
	for g := range docs {
		p, err := eval.Passkey(rand.New(rand.NewPCG(seed, stream+uint64(g))), length, eval.PasskeyOptions{})
		if err != nil {
			return nil, err
		}
		docs[g] = p
	}
	out := make([]prompt, n)
	for i := range out {
		d := docs[i%len(docs)]
		// The documents' heads differ: passkey contexts share their
		// intro and filler up to the fact, which a prefix cache would
		// serve across documents.
		g := i % len(docs)
		out[i] = prompt{text: fmt.Sprintf("Document %d.%d. %sQuestion %d. %s", stream>>32, g, d.Context, i, d.Question), answer: d.Answer}
	}
	return out, nil
}
