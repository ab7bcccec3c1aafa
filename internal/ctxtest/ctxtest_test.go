package ctxtest

import (
	"context"
	"testing"
)

func TestCountdown(t *testing.T) {
	c := NewCountdown(2)
	for i, want := range []error{nil, nil, context.Canceled, context.Canceled} {
		if got := c.Err(); got != want {
			t.Fatalf("question %d: Err = %v, want %v", i, got, want)
		}
	}
	if got := c.Left(); got != -2 {
		t.Fatalf("Left = %d after four questions of two, want -2", got)
	}
	c.Reset(0)
	if c.Err() != context.Canceled || c.Left() != -1 {
		t.Fatalf("after Reset(0): the first question sees the context done, Left = %d", c.Left())
	}
	if c.Done() != nil {
		t.Fatal("Done is Background's: never closed")
	}
}
