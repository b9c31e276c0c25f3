//go:build cuda

package cuda

import (
	"fmt"

	"github.com/questrt/questrt/kernels"
)

// Validation of a call's shape and batch against what the kernels take.

// validate checks the batch against the call's pool: the device layer's or
// the host arrays'.
func validate(s kernels.Shape, l kernels.Layer, bt *kernels.Batch, withKV bool) error {
	if l.SubBoxes > 1 {
		return fmt.Errorf("cuda: %w (%d per page)", kernels.ErrSubBoxes, l.SubBoxes)
	}
	if dl, ok := l.Device.(*DeviceLayer); ok {
		if withKV && l.Slots == nil {
			return bt.ValidatePool(s, dl.kvPages()) // a slot pool is attended by slot
		}
		return bt.ValidatePool(s, dl.Pages)
	}
	if withKV {
		return bt.Validate(s, l)
	}
	return bt.ValidateSummaries(s, l)
}

func checkShape(s kernels.Shape) error {
	if err := s.Validate(); err != nil {
		return err
	}
	switch {
	case s.HeadDim%8 != 0 || s.HeadDim > 256:
		return fmt.Errorf("cuda: head dim %d must be a multiple of 8 up to 256", s.HeadDim)
	case s.Group() > 32:
		return fmt.Errorf("cuda: %d query heads per KV head (max 32)", s.Group())
	case s.PageSize > 64 || s.PageSize*s.HeadDim > 4096:
		return fmt.Errorf("cuda: page of %d x %d elements exceeds the attention tile (S <= 64, S*D <= 4096)", s.PageSize, s.HeadDim)
	}
	return nil
}
