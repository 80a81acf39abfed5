package argschema

import (
	"encoding/json"
	"fmt"
	"math/big"
	"slices"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// english prints the library's own message for a kind we do not word.
var english = message.NewPrinter(language.English)

// Problem ranks: the order in which an error lists them.
const (
	rankRequired = iota // a required top-level field is missing
	rankField           // something wrong with one field (or the whole object)
	rankUnknown         // a top-level field the schema does not allow
)

// problem is one thing wrong with a call's arguments.
type problem struct {
	rank  int
	field int    // declared position of the top-level field concerned
	top   string // that field's name; "" for the object itself
	path  string // where in the arguments, as the message names it
	msg   string // the whole sentence
}

// problems collects a call's problems; String sorts and joins them.
type problems []problem

// has reports whether a problem about top-level field name is listed.
func (ps problems) has(name string) bool {
	return slices.ContainsFunc(ps, func(p problem) bool { return p.rank == rankField && p.top == name })
}

// add records a problem at location loc (instance tokens) of the doc.
func (ps *problems) add(s *Schema, loc []string, what string) {
	ps.addAt(s, loc, locText(loc, nil), what)
}

func (ps *problems) addAt(s *Schema, loc []string, path, what string) {
	p := problem{rank: rankField, field: -1, path: path}
	if len(loc) > 0 {
		p.top = loc[0]
		p.field = s.position(loc[0])
	}
	p.msg = subject(path) + " " + what
	*ps = append(*ps, p)
}

// position is the declared position of a top-level field, after every
// declared one if it is not declared.
func (s *Schema) position(name string) int {
	if i, ok := s.index[name]; ok {
		return i
	}
	return len(s.order)
}

// walk turns a validation error tree into problems.
func (ps *problems) walk(s *Schema, e *jsonschema.ValidationError, doc any) {
	path := locText(e.InstanceLocation, doc)
	switch k := e.ErrorKind.(type) {
	case *kind.Schema, *kind.Group, *kind.AllOf, *kind.Reference:
		for _, c := range e.Causes {
			ps.walk(s, c, doc)
		}
		if len(e.Causes) == 0 {
			ps.addAt(s, e.InstanceLocation, path, "is invalid")
		}
	case *kind.Required:
		if len(e.InstanceLocation) > 0 {
			ps.addAt(s, e.InstanceLocation, path, "is missing required field "+quoteAll(k.Missing))
			return
		}
		for _, name := range k.Missing {
			*ps = append(*ps, problem{rank: rankRequired, msg: fmt.Sprintf("missing required field %q", name)})
		}
	case *kind.AdditionalProperties:
		names := slices.Sorted(slices.Values(k.Properties))
		if len(e.InstanceLocation) > 0 {
			ps.addAt(s, e.InstanceLocation, path, "has unknown field "+quoteAll(names))
			return
		}
		allowed := "none"
		if len(s.order) > 0 {
			allowed = strings.Join(s.order, ", ")
		}
		for _, name := range names {
			*ps = append(*ps, problem{rank: rankUnknown, top: name, path: name,
				msg: fmt.Sprintf("unknown field %q (allowed: %s)", name, allowed)})
		}
	default:
		ps.addAt(s, e.InstanceLocation, path, describe(e, valueAt(doc, e.InstanceLocation)))
	}
}

// describe words one failed keyword as a predicate of the value v.
func describe(e *jsonschema.ValidationError, v any) string {
	switch k := e.ErrorKind.(type) {
	case *kind.Type:
		got := k.Got
		if n, ok := v.(json.Number); ok && slices.Contains(k.Want, "integer") {
			got = string(n)
		}
		wants := make([]string, len(k.Want))
		for i, w := range k.Want {
			wants[i] = article(w)
		}
		return "must be " + strings.Join(wants, " or ") + ", got " + got
	case *kind.Enum:
		want := make([]string, len(k.Want))
		for i, w := range k.Want {
			want[i] = display(w)
		}
		if len(want) == 1 {
			return "must be " + want[0] + ", got " + display(v)
		}
		return "must be one of " + strings.Join(want, ", ") + ", got " + display(v)
	case *kind.Const:
		return "must be " + display(k.Want) + ", got " + display(v)
	case *kind.Minimum:
		return "must be at least " + ratText(k.Want) + ", got " + display(v)
	case *kind.Maximum:
		return "must be at most " + ratText(k.Want) + ", got " + display(v)
	case *kind.ExclusiveMinimum:
		return "must be greater than " + ratText(k.Want) + ", got " + display(v)
	case *kind.ExclusiveMaximum:
		return "must be less than " + ratText(k.Want) + ", got " + display(v)
	case *kind.MultipleOf:
		return "must be a multiple of " + ratText(k.Want) + ", got " + display(v)
	case *kind.MinLength:
		return fmt.Sprintf("must be at least %d characters long, got %d", k.Want, k.Got)
	case *kind.MaxLength:
		return fmt.Sprintf("must be at most %d characters long, got %d", k.Want, k.Got)
	case *kind.Pattern:
		return fmt.Sprintf("must match the pattern %q, got %q", k.Want, k.Got)
	case *kind.MinItems:
		return fmt.Sprintf("must have at least %d items, got %d", k.Want, k.Got)
	case *kind.MaxItems:
		return fmt.Sprintf("must have at most %d items, got %d", k.Want, k.Got)
	case *kind.MinProperties:
		return fmt.Sprintf("must have at least %d fields, got %d", k.Want, k.Got)
	case *kind.MaxProperties:
		return fmt.Sprintf("must have at most %d fields, got %d", k.Want, k.Got)
	case *kind.UniqueItems:
		return fmt.Sprintf("must have unique items, but items %d and %d are equal", k.Duplicates[0], k.Duplicates[1])
	case *kind.Dependency:
		return fmt.Sprintf("needs field %s when %q is given", quoteAll(k.Missing), k.Prop)
	case *kind.DependentRequired:
		return fmt.Sprintf("needs field %s when %q is given", quoteAll(k.Missing), k.Prop)
	case *kind.Format:
		return fmt.Sprintf("must be a valid %s, got %s (%v)", k.Want, display(k.Got), k.Err)
	case *kind.FalseSchema:
		return "is not allowed"
	case *kind.Not:
		return `must not match the schema under "not"`
	case *kind.AnyOf:
		return "must match one of its allowed forms" + alternatives(e, v)
	case *kind.OneOf:
		if len(k.Subschemas) == 2 {
			return fmt.Sprintf("must match exactly one of its allowed forms, matched forms %d and %d", k.Subschemas[0]+1, k.Subschemas[1]+1)
		}
		return "must match exactly one of its allowed forms" + alternatives(e, v)
	default:
		return "is invalid: " + k.LocalizedString(english)
	}
}

// alternatives words why each alternative of an anyOf or oneOf failed:
// " (form 1: …; form 2: …)". v is the value at e's location.
func alternatives(e *jsonschema.ValidationError, v any) string {
	if len(e.Causes) == 0 {
		return ""
	}
	parts := make([]string, len(e.Causes))
	for i, c := range e.Causes {
		var sub problems
		sub.walkUnder(c, len(e.InstanceLocation), v)
		msgs := make([]string, len(sub))
		for j, p := range sub {
			msgs[j] = p.msg
		}
		parts[i] = fmt.Sprintf("form %d: %s", i+1, strings.Join(msgs, ", "))
	}
	return " (" + strings.Join(parts, "; ") + ")"
}

// walkUnder words the problems of one alternative relative to the
// alternatives' location (depth base, value v): a problem there itself is
// a bare predicate.
func (ps *problems) walkUnder(e *jsonschema.ValidationError, base int, v any) {
	switch e.ErrorKind.(type) {
	case *kind.Schema, *kind.Group, *kind.AllOf, *kind.Reference:
		for _, c := range e.Causes {
			ps.walkUnder(c, base, v)
		}
		if len(e.Causes) > 0 {
			return
		}
	}
	rel := e.InstanceLocation[min(base, len(e.InstanceLocation)):]
	var msg string
	switch k := e.ErrorKind.(type) {
	case *kind.Required:
		msg = "is missing required field " + quoteAll(k.Missing)
	case *kind.AdditionalProperties:
		msg = "has unknown field " + quoteAll(slices.Sorted(slices.Values(k.Properties)))
	case *kind.Schema, *kind.Group, *kind.AllOf, *kind.Reference:
		msg = "is invalid"
	default:
		msg = describe(e, valueAt(v, rel))
	}
	if len(rel) > 0 {
		msg = subject(locText(rel, v)) + " " + msg
	}
	*ps = append(*ps, problem{msg: msg})
}

// String lists the problems: required fields, then fields in declared
// order (a field's own problems in the order found), then unknown fields.
func (ps problems) String() string {
	slices.SortStableFunc(ps, func(a, b problem) int {
		if a.rank != b.rank {
			return a.rank - b.rank
		}
		if a.rank == rankRequired {
			return 0
		}
		if a.field != b.field {
			return a.field - b.field
		}
		return strings.Compare(a.path, b.path)
	})
	msgs := make([]string, len(ps))
	for i, p := range ps {
		msgs[i] = p.msg
	}
	return strings.Join(msgs, "; ")
}

// subject names what a message is about: `field "a.b[0]"`, or the
// arguments themselves.
func subject(path string) string {
	if path == "" {
		return "arguments"
	}
	return "field " + strconv.Quote(path)
}

// locText writes instance tokens as a.b[0]; with doc it knows which
// tokens index arrays, without it every token is a name.
func locText(loc []string, doc any) string {
	var b strings.Builder
	v := doc
	for i, tok := range loc {
		arr, isArr := v.([]any)
		switch {
		case isArr:
			b.WriteString("[" + tok + "]")
			if n, err := strconv.Atoi(tok); err == nil && n >= 0 && n < len(arr) {
				v = arr[n]
			} else {
				v = nil
			}
		default:
			if i > 0 {
				b.WriteByte('.')
			}
			b.WriteString(tok)
			if m, ok := v.(map[string]any); ok {
				v = m[tok]
			} else {
				v = nil
			}
		}
	}
	return b.String()
}

// valueAt is the value at instance location loc of doc, or nil.
func valueAt(doc any, loc []string) any {
	v := doc
	for _, tok := range loc {
		switch x := v.(type) {
		case map[string]any:
			v = x[tok]
		case []any:
			n, err := strconv.Atoi(tok)
			if err != nil || n < 0 || n >= len(x) {
				return nil
			}
			v = x[n]
		default:
			return nil
		}
	}
	return v
}

// kindOf names the JSON type of a decoded value.
func kindOf(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case json.Number, float64:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

// article is a JSON type name with its article: "a string", "an integer".
func article(typ string) string {
	switch typ {
	case "integer", "object", "array":
		return "an " + typ
	case "null":
		return "null"
	}
	return "a " + typ
}

// display writes a small value for a message: JSON, shortened past 80
// characters.
func display(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	if s := string(b); len(s) <= 80 {
		return s
	}
	return string(b[:77]) + "..."
}

// ratText writes a schema number as a decimal: 1, 0.5, 1e+30.
func ratText(r *big.Rat) string {
	if r == nil {
		return "?"
	}
	if r.IsInt() {
		return r.Num().String()
	}
	f, _ := r.Float64()
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// quoteAll writes names quoted and joined: "a", "b".
func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = strconv.Quote(n)
	}
	return strings.Join(q, ", ")
}
