// This file holds helpers over the plain values that the pickle loader
// returns (gopickle's types): lookups, conversions and Python's repr.

package pytorch

import (
	"fmt"
	"math/big"
	"strconv"
	"strings"

	"github.com/nlpodyssey/gopickle/types"

	"github.com/gpumem/gpumem/trace"
)

// dictGet returns the value of key in d. A pickle may set a key twice;
// the last value counts, as in Python.
func dictGet(d *types.Dict, key string) (any, bool) {
	for i := len(*d) - 1; i >= 0; i-- {
		e := (*d)[i]
		if k, ok := e.Key.(string); ok && k == key {
			return e.Value, true
		}
	}
	return nil, false
}

func asList(v any) ([]any, bool) {
	switch x := v.(type) {
	case *types.List:
		return *x, true
	case *types.Tuple:
		return *x, true
	}
	return nil, false
}

func asInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	case *big.Int:
		if x.IsInt64() {
			return x.Int64(), true
		}
	}
	return 0, false
}

func dictString(d *types.Dict, key string) (string, error) {
	v, ok := dictGet(d, key)
	if !ok {
		return "", fmt.Errorf("no %q", key)
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%q is a %s, not a string", key, pyTypeName(v))
	}
	return s, nil
}

func dictUint(d *types.Dict, key string) (uint64, error) {
	v, ok := dictGet(d, key)
	if !ok {
		return 0, fmt.Errorf("no %q", key)
	}
	switch x := v.(type) {
	case int:
		if x >= 0 {
			return uint64(x), nil
		}
	case *big.Int:
		if x.IsUint64() {
			return x.Uint64(), nil
		}
	default:
		return 0, fmt.Errorf("%q is a %s, not an integer", key, pyTypeName(v))
	}
	return 0, fmt.Errorf("%q is %s, not a non-negative 64-bit integer", key, trace.Excerpt(fmt.Sprint(v)))
}

func pyTypeName(v any) string {
	switch v.(type) {
	case nil:
		return "None"
	case bool:
		return "bool"
	case int, *big.Int:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []byte:
		return "bytes"
	case *types.ByteArray:
		return "bytearray"
	case *types.List:
		return "list"
	case *types.Tuple:
		return "tuple"
	case *types.Dict:
		return "dict"
	case *types.Set:
		return "set"
	case *types.FrozenSet:
		return "frozenset"
	}
	return fmt.Sprintf("%T", v)
}

var reprEscaper = strings.NewReplacer(`\`, `\\`, "'", `\'`, "\n", `\n`, "\r", `\r`, "\t", `\t`)

// maxReprLen bounds pyRepr's output; a snapshot's settings are short.
const maxReprLen = 4096

// pyRepr writes v the way Python's repr would, for the plain values a
// snapshot holds, cut short after maxReprLen bytes: every container checks
// the length before each element, not only on entry, so that a list that
// holds itself a million times (through the memo) stops at the limit
// instead of each level appending its elements' "...".
func pyRepr(b *strings.Builder, v any, depth int) {
	if b.Len() > maxReprLen || depth > maxPickleDepth {
		b.WriteString("...")
		return
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("None")
	case bool:
		if x {
			b.WriteString("True")
		} else {
			b.WriteString("False")
		}
	case int:
		b.WriteString(strconv.Itoa(x))
	case *big.Int:
		b.WriteString(x.String())
	case float64:
		s := strconv.FormatFloat(x, 'g', -1, 64)
		if !strings.ContainsAny(s, ".eEn") {
			s += ".0"
		}
		b.WriteString(s)
	case string:
		b.WriteString("'")
		if len(x) > maxReprLen {
			b.WriteString(reprEscaper.Replace(strings.ToValidUTF8(x[:maxReprLen], "")))
			b.WriteString("'...")
			break
		}
		b.WriteString(reprEscaper.Replace(x))
		b.WriteString("'")
	case *types.List:
		b.WriteString("[")
		for i, e := range *x {
			if b.Len() > maxReprLen {
				b.WriteString("...")
				break
			}
			if i > 0 {
				b.WriteString(", ")
			}
			pyRepr(b, e, depth+1)
		}
		b.WriteString("]")
	case *types.Tuple:
		b.WriteString("(")
		for i, e := range *x {
			if b.Len() > maxReprLen {
				b.WriteString("...")
				break
			}
			if i > 0 {
				b.WriteString(", ")
			}
			pyRepr(b, e, depth+1)
		}
		if len(*x) == 1 {
			b.WriteString(",")
		}
		b.WriteString(")")
	case *types.Dict:
		b.WriteString("{")
		for i, e := range *x {
			if b.Len() > maxReprLen {
				b.WriteString("...")
				break
			}
			if i > 0 {
				b.WriteString(", ")
			}
			pyRepr(b, e.Key, depth+1)
			b.WriteString(": ")
			pyRepr(b, e.Value, depth+1)
		}
		b.WriteString("}")
	default:
		b.WriteString("<" + pyTypeName(v) + ">")
	}
}
