package console

import (
	"bytes"
	"encoding/json"
	"unicode"
	"unicode/utf8"
)

// PayloadKind is how a payload can be shown.
type PayloadKind string

const (
	// PayloadJSON is a payload that is one JSON value.
	PayloadJSON PayloadKind = "json"
	// PayloadText is UTF-8 text without control characters other than
	// tabs and line breaks.
	PayloadText PayloadKind = "text"
	// PayloadBinary is anything else, shown as a byte count.
	PayloadBinary PayloadKind = "binary"
)

// FormatPayload returns how payload can be shown and its text: JSON
// indented by two spaces, text as it is, and "" for binary.
func FormatPayload(payload []byte) (PayloadKind, string) {
	if len(payload) > 0 && json.Valid(payload) {
		var out bytes.Buffer
		if err := json.Indent(&out, payload, "", "  "); err == nil {
			return PayloadJSON, out.String()
		}
	}
	if !utf8.Valid(payload) {
		return PayloadBinary, ""
	}
	for _, r := range string(payload) {
		if r != '\n' && r != '\t' && r != '\r' && !unicode.IsPrint(r) && !unicode.IsSpace(r) {
			return PayloadBinary, ""
		}
	}
	return PayloadText, string(payload)
}
