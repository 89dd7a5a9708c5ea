package leased

import (
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// appendRequest writes req as one JSON line without reflection for the
// value types requests carry (the hot path of every lock and unlock);
// anything else goes through encoding/json.
func appendRequest(buf []byte, req map[string]any) ([]byte, error) {
	buf = append(buf, '{')
	first := true
	for k, v := range req {
		if !first {
			buf = append(buf, ',')
		}
		first = false
		buf = appendString(buf, k)
		buf = append(buf, ':')
		var err error
		if buf, err = appendValue(buf, v); err != nil {
			return nil, err
		}
	}
	return append(buf, '}', '\n'), nil
}

func appendValue(buf []byte, v any) ([]byte, error) {
	switch x := v.(type) {
	case string:
		return appendString(buf, x), nil
	case int:
		return strconv.AppendInt(buf, int64(x), 10), nil
	case int64:
		return strconv.AppendInt(buf, x, 10), nil
	case bool:
		return strconv.AppendBool(buf, x), nil
	case nil:
		return append(buf, "null"...), nil
	case *string:
		if x == nil {
			return append(buf, "null"...), nil
		}
		return appendString(buf, *x), nil
	case []string:
		buf = append(buf, '[')
		for i, s := range x {
			if i > 0 {
				buf = append(buf, ',')
			}
			buf = appendString(buf, s)
		}
		return append(buf, ']'), nil
	}
	b, err := json.Marshal(v)
	return append(buf, b...), err
}

// appendString quotes s as JSON; strings with control characters,
// quotes, backslashes or invalid UTF-8 take encoding/json's path.
func appendString(buf []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf {
			if c >= utf8.RuneSelf && utf8.ValidString(s) && plain(s[i:]) {
				break
			}
			b, _ := json.Marshal(s)
			return append(buf, b...)
		}
	}
	buf = append(buf, '"')
	buf = append(buf, s...)
	return append(buf, '"')
}

// plain reports whether s needs no escape beyond being valid UTF-8
// (encoding/json also escapes <, >, & and U+2028/9, which JSON does not
// require).
func plain(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == '"' || r == '\\' || r == 0x2028 || r == 0x2029 {
			return false
		}
	}
	return true
}
