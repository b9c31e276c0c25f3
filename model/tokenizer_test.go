package model

import (
	"slices"
	"testing"
)

// TestPromptAndStopIDs: BOS goes first only where the tokenizer has one;
// the config's EOS list wins over the tokenizer's EOS.
func TestPromptAndStopIDs(t *testing.T) {
	bt := &ByteTokenizer{Vocab: 258}
	if got := PromptIDs(bt, "ab"); !slices.Equal(got, []int{ByteBOS, 'a', 'b'}) {
		t.Errorf("byte prompt %v", got)
	}
	if got := StopIDs(bt, Config{}); !slices.Equal(got, []int{ByteEOS}) {
		t.Errorf("byte stop %v", got)
	}
	if got := StopIDs(bt, Config{EOSList: []int{5, 7}}); !slices.Equal(got, []int{5, 7}) {
		t.Errorf("config stop %v", got)
	}
	nb := noSpecial{bt}
	if got := PromptIDs(nb, "ab"); !slices.Equal(got, []int{'a', 'b'}) || StopIDs(nb, Config{}) != nil {
		t.Errorf("no BOS/EOS: prompt %v, stop %v", got, StopIDs(nb, Config{}))
	}
}

// noSpecial is a tokenizer without BOS and EOS.
type noSpecial struct{ *ByteTokenizer }

func (noSpecial) BOS() int { return -1 }
func (noSpecial) EOS() int { return -1 }
