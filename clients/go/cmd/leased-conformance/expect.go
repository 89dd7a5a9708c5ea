package main

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// check matches a step's result against its expect.
func (r *run) check(exp, res map[string]any) error {
	keys := make([]string, 0, len(exp))
	for k := range exp {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if _, want := exp["error"]; !want {
		if code, bad := res["error"]; bad {
			return fmt.Errorf("error %v", code)
		}
	}
	for _, k := range keys {
		got, present := res[k]
		if err := r.match(k, exp[k], got, present); err != nil {
			return err
		}
	}
	return nil
}

func (r *run) match(field string, m, got any, present bool) error {
	if op, ok := m.(map[string]any); ok && len(op) == 1 {
		for name, x := range op {
			want, err := r.value(x)
			if err != nil {
				return err
			}
			if !present || !compare(name, got, want) {
				return fmt.Errorf("expected %s %s %s, got %s", field, name,
					show(want), showGot(got, present))
			}
		}
		return nil
	}
	want, err := r.value(m)
	if err != nil {
		return err
	}
	if !present || !equal(got, want) {
		return fmt.Errorf("expected %s %s, got %s", field, show(want),
			showGot(got, present))
	}
	return nil
}

// value resolves "$NAME.FIELD" against the saved results.
func (r *run) value(x any) (any, error) {
	s, ok := x.(string)
	if !ok || !strings.HasPrefix(s, "$") {
		return x, nil
	}
	name, field, found := strings.Cut(s[1:], ".")
	saved := r.saved[name]
	if !found || saved == nil {
		return nil, fmt.Errorf("no saved result %s", s)
	}
	v, ok := saved[field]
	if !ok {
		return nil, fmt.Errorf("saved result %s has no field %s", name, field)
	}
	return v, nil
}

func compare(op string, got, want any) bool {
	if op == "ne" {
		return !equal(got, want)
	}
	g, ok1 := got.(float64)
	w, ok2 := want.(float64)
	if !ok1 || !ok2 {
		return false
	}
	switch op {
	case "gt":
		return g > w
	case "ge":
		return g >= w
	case "lt":
		return g < w
	case "le":
		return g <= w
	}
	return false
}

func equal(a, b any) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return string(ja) == string(jb)
}

func show(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func showGot(v any, present bool) string {
	if !present {
		return "nothing"
	}
	return show(v)
}
