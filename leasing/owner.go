package leasing

import (
	"crypto/rand"
	"encoding/hex"
	"strings"
	"unicode/utf8"
)

// MaxOwnerLabelBytes is the longest label NewOwner keeps whole:
// MaxOwnerBytes less the 13 bytes of its suffix.
const MaxOwnerLabelBytes = MaxOwnerBytes - 13

// ValidateOwnerLabel returns nil when NewOwner keeps label whole:
// 1..MaxOwnerLabelBytes bytes of UTF-8 without NUL.
//
// Errors: an *ArgumentError for field "owner".
func ValidateOwnerLabel(label string) error {
	if len(label) > MaxOwnerLabelBytes {
		return argumentError("owner", "label must be at most %d bytes, got %d", MaxOwnerLabelBytes, len(label))
	}
	return validateOwner(label)
}

// NewOwner returns a lease owner name made of label and a random suffix,
// "label-3f9a1c2e7b40", so that two processes started with the same label
// are still told apart. An empty label becomes "worker"; a label longer than
// MaxOwnerLabelBytes is cut.
func NewOwner(label string) string {
	if label == "" {
		label = "worker"
	}
	if len(label) > MaxOwnerLabelBytes {
		label = label[:MaxOwnerLabelBytes]
	}
	var suffix [6]byte
	_, _ = rand.Read(suffix[:]) // crypto/rand.Read never fails on supported platforms
	return label + "-" + hex.EncodeToString(suffix[:])
}

// ownerSuffixRunes is the length of NewOwner's suffix, "-" and 12 hex
// digits.
const ownerSuffixRunes = 13

// madeFrom reports whether owner has the shape NewOwner(label) gives: the
// label, "-" and 12 characters (the SQL of ExpirePrevious counts alike).
func madeFrom(owner, label string) bool {
	return strings.HasPrefix(owner, label+"-") && utf8.RuneCountInString(owner) == utf8.RuneCountInString(label)+ownerSuffixRunes
}
