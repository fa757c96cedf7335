package config

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
)

// unknownFields walks a decoded YAML document against the Config type and returns one error per
// key that no field declares, each with its full path ("audit.file.maxsize"), so a typo is
// reported where it is rather than by its last name only.
func unknownFields(doc any) []error {
	var errs []error
	walkUnknown(doc, reflect.TypeOf(Config{}), "", &errs)
	return errs
}

func walkUnknown(doc any, t reflect.Type, path string, errs *[]error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch v := doc.(type) {
	case map[string]any:
		switch t.Kind() {
		case reflect.Struct:
			fields := jsonFields(t)
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				ft, ok := fields[k]
				if !ok {
					*errs = append(*errs, fmt.Errorf("unknown field %q (check the spelling; see examples/sandgate.yaml)", join(path, k)))
					continue
				}
				walkUnknown(v[k], ft, join(path, k), errs)
			}
		case reflect.Map:
			for k, e := range v {
				walkUnknown(e, t.Elem(), join(path, k), errs)
			}
		}
	case []any:
		if t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
			for i, e := range v {
				walkUnknown(e, t.Elem(), fmt.Sprintf("%s[%d]", path, i), errs)
			}
		}
	}
}

func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if f.Anonymous && name == "" {
			for k, v := range jsonFields(f.Type) {
				out[k] = v
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
