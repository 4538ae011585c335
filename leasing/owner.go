package leasing

import (
	"crypto/rand"
	"encoding/hex"
)

// NewOwner returns a lease owner name made of label and a random suffix,
// "label-3f9a1c2e7b40", so that two processes started with the same label
// are still told apart. An empty label becomes "worker"; a label longer than
// MaxOwnerBytes-13 bytes is cut.
func NewOwner(label string) string {
	if label == "" {
		label = "worker"
	}
	if max := MaxOwnerBytes - 13; len(label) > max {
		label = label[:max]
	}
	var suffix [6]byte
	_, _ = rand.Read(suffix[:]) // crypto/rand.Read never fails on supported platforms
	return label + "-" + hex.EncodeToString(suffix[:])
}
