package suggest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/pmezard/go-difflib/difflib"
	"go.yaml.in/yaml/v3"
	sigsyaml "sigs.k8s.io/yaml"
)

// maxDataFile bounds a data file read for editing.
const maxDataFile = 8 << 20

// dataFile is the YAML data file that holds templates[T], parsed for editing (comments and
// layout kept) and as the policies read it.
type dataFile struct {
	name      string // relative to the policy folder
	text      []byte
	root      *yaml.Node
	template  *yaml.Node // templates[T], a mapping
	tmpl      templateData
	providers map[string]provider
}

// readData finds the data file of the policy folder dir that holds templates[template], and the
// providers (in it or in another data file of the folder).
func readData(dir, template string) (*dataFile, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.y*ml"))
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var found *dataFile
	providers := map[string]provider{}
	for _, name := range names {
		if ext := filepath.Ext(name); ext != ".yaml" && ext != ".yml" {
			continue
		}
		text, err := readBounded(name)
		if err != nil {
			return nil, err
		}
		var doc struct {
			Templates map[string]templateData `json:"templates"`
			Providers map[string]provider     `json:"providers"`
		}
		if err := sigsyaml.Unmarshal(text, &doc); err != nil {
			return nil, fmt.Errorf("data file %s: %w", name, err)
		}
		for k, v := range doc.Providers {
			providers[k] = v
		}
		t, ok := doc.Templates[template]
		if !ok {
			continue
		}
		if found != nil {
			return nil, fmt.Errorf("templates.%s is in both %s and %s: keep it in one data file", template, found.name, filepath.Base(name))
		}
		found = &dataFile{name: filepath.Base(name), text: text, tmpl: t}
		if err := found.parse(template); err != nil {
			return nil, fmt.Errorf("data file %s: %w", name, err)
		}
	}
	if found == nil {
		return nil, fmt.Errorf("no data file in %s has templates.%s: suggest edits a template's entry in a YAML data file (policies/data.yaml)", dir, template)
	}
	found.providers = providers
	return found, nil
}

func readBounded(name string) ([]byte, error) {
	st, err := os.Stat(name)
	if err != nil {
		return nil, err
	}
	if st.Size() > maxDataFile {
		return nil, fmt.Errorf("data file %s is larger than %d bytes", name, maxDataFile)
	}
	return os.ReadFile(name)
}

func (d *dataFile) parse(template string) error {
	d.root = &yaml.Node{}
	if err := yaml.Unmarshal(d.text, d.root); err != nil {
		return err
	}
	if len(d.root.Content) == 0 {
		return fmt.Errorf("empty document")
	}
	templates := get(d.root.Content[0], "templates")
	d.template = get(templates, template)
	if d.template == nil || d.template.Kind != yaml.MappingNode {
		return fmt.Errorf("templates.%s is not a mapping", template)
	}
	return nil
}

// get is the value of key in mapping m (nil when m is not a mapping or has no such key).
func get(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

// ensure is the value of key in m, added as a new node of kind (flow style) when absent.
func ensure(m *yaml.Node, key string, kind yaml.Kind) *yaml.Node {
	if v := get(m, key); v != nil {
		return v
	}
	v := &yaml.Node{Kind: kind}
	if kind == yaml.SequenceNode || kind == yaml.MappingNode {
		v.Style = yaml.FlowStyle
	}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: key}, v)
	return v
}

func remove(m *yaml.Node, key string) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content = slices.Delete(m.Content, i, i+2)
			return
		}
	}
}

// str is a string scalar quoted like the sequence's other items (double quotes when it has none).
func str(seq *yaml.Node, v string) *yaml.Node {
	style := yaml.DoubleQuotedStyle
	for _, n := range seq.Content {
		if n.Kind == yaml.ScalarNode && n.Tag != "!!int" {
			style = n.Style
			break
		}
	}
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: v, Style: style}
}

func intNode(v string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: v} }

func appendItem(seq, item *yaml.Node, note string) {
	for _, n := range seq.Content {
		if n.Value == item.Value {
			return
		}
	}
	seq.Content = append(seq.Content, item)
	seq.LineComment = joinNote(seq.LineComment, note)
}

func dropItem(seq *yaml.Node, v string) {
	if seq == nil {
		return
	}
	seq.Content = slices.DeleteFunc(seq.Content, func(n *yaml.Node) bool { return n.Value == v })
}

func joinNote(comment, note string) string {
	if comment == "" {
		return "# " + note
	}
	return comment + "; " + note
}

// apply edits the template's entry: the additions, then the removals.
func (d *dataFile) apply(add, rm []Entry) {
	t := d.template
	for _, e := range add {
		note := "suggested: +" + e.Value
		switch e.Section {
		case SectionTools:
			d.addTool(e.Scope, e.Value, note)
		case SectionHosts:
			appendItem(ensure(t, "hosts", yaml.SequenceNode), str(get(t, "hosts"), e.Value), note)
		case SectionPorts:
			ports := ensure(t, "ports", yaml.MappingNode)
			seq := get(ports, e.Scope)
			if seq == nil {
				// A host's ports replace the default 80 and 443: keep them beside the new one.
				seq = ensure(ports, e.Scope, yaml.SequenceNode)
				seq.Content = []*yaml.Node{intNode("80"), intNode("443")}
			}
			appendItem(seq, intNode(e.Value), note)
		case SectionModels:
			m := d.provider(e.Scope)
			appendItem(ensure(m, "allow", yaml.SequenceNode), str(get(m, "allow"), e.Value), note)
		case SectionMaxTokens:
			m := d.provider(e.Scope)
			cap := ensure(m, "max_tokens", yaml.ScalarNode)
			cap.Kind, cap.Tag, cap.Value, cap.Style = yaml.ScalarNode, "!!int", e.Value, 0
			cap.LineComment = "# suggested: raised to " + e.Value
		}
	}
	for _, e := range rm {
		switch e.Section {
		case SectionTools:
			d.removeTool(e.Scope, e.Value)
		case SectionHosts:
			dropItem(get(t, "hosts"), e.Value)
		case SectionPorts:
			dropItem(get(get(t, "ports"), e.Scope), e.Value)
		case SectionModels:
			models := get(t, "models")
			m := get(models, e.Scope)
			dropItem(get(m, "allow"), e.Value)
			if allow := get(m, "allow"); allow != nil && len(allow.Content) == 0 {
				remove(models, e.Scope)
			}
		}
	}
}

func (d *dataFile) addTool(upstream, tool, note string) {
	tools := ensure(d.template, "tools", yaml.SequenceNode)
	for _, entry := range tools.Content {
		if u := get(entry, "upstream"); u != nil && u.Value == upstream {
			appendItem(ensure(entry, "allow", yaml.SequenceNode), str(get(entry, "allow"), tool), note)
			return
		}
	}
	allow := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
	allow.Content = []*yaml.Node{{Kind: yaml.ScalarNode, Tag: "!!str", Value: tool, Style: yaml.DoubleQuotedStyle}}
	entry := &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{
		{Kind: yaml.ScalarNode, Value: "upstream"}, {Kind: yaml.ScalarNode, Value: upstream},
		{Kind: yaml.ScalarNode, Value: "allow"}, allow}}
	allow.LineComment = "# " + note
	if tools.Style == yaml.FlowStyle {
		entry.Style = yaml.FlowStyle
	}
	tools.Content = append(tools.Content, entry)
}

func (d *dataFile) removeTool(upstream, pattern string) {
	tools := get(d.template, "tools")
	if tools == nil {
		return
	}
	tools.Content = slices.DeleteFunc(tools.Content, func(entry *yaml.Node) bool {
		if u := get(entry, "upstream"); u == nil || u.Value != upstream {
			return false
		}
		dropItem(get(entry, "allow"), pattern)
		dropItem(get(entry, "grant_scoped"), pattern)
		allow := get(entry, "allow")
		return allow == nil || len(allow.Content) == 0 // an entry that allows nothing goes
	})
}

// provider is templates[T].models[p], added as {allow: [], max_tokens: 0} when absent.
func (d *dataFile) provider(p string) *yaml.Node {
	models := ensure(d.template, "models", yaml.MappingNode)
	if m := get(models, p); m != nil {
		return m
	}
	m := &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{
		{Kind: yaml.ScalarNode, Value: "allow"}, {Kind: yaml.SequenceNode, Style: yaml.FlowStyle},
		{Kind: yaml.ScalarNode, Value: "max_tokens"}, intNode("0")}}
	if models.Style == yaml.FlowStyle {
		models.Style = 0 // a block of its own reads better than a nested flow mapping
	}
	models.Content = append(models.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: p}, m)
	return m
}

// render writes the edited document in the file's layout: the YAML encoder drops blank lines,
// so a blank line of the original that only the encoder removed is put back.
func (d *dataFile) render() ([]byte, error) {
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(d.root); err != nil {
		return nil, fmt.Errorf("write data file %s: %w", d.name, err)
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	orig, edited := lines(string(d.text)), lines(b.String())
	m := difflib.NewMatcher(orig, edited)
	var out []string
	for _, op := range m.GetOpCodes() {
		switch op.Tag {
		case 'e':
			out = append(out, orig[op.I1:op.I2]...)
		case 'd':
			if allBlank(orig[op.I1:op.I2]) {
				out = append(out, orig[op.I1:op.I2]...)
			}
		case 'i', 'r':
			out = append(out, edited[op.J1:op.J2]...)
		}
	}
	// The encoder ends a document whose last line has a comment with a blank line; the file's
	// own ending stands.
	text := strings.TrimRight(strings.Join(out, ""), "\n")
	ending := len(d.text) - len(bytes.TrimRight(d.text, "\n"))
	return []byte(text + strings.Repeat("\n", ending)), nil
}

func lines(s string) []string { return difflib.SplitLines(s) }

func allBlank(ls []string) bool {
	for _, l := range ls {
		if strings.TrimSpace(l) != "" {
			return false
		}
	}
	return true
}

// unifiedDiff is the change from the file's text to edited.
func (d *dataFile) unifiedDiff(edited []byte, dir string) string {
	name := filepath.Join(dir, d.name)
	s, _ := difflib.GetUnifiedDiffString(difflib.UnifiedDiff{A: lines(string(d.text)), B: lines(string(edited)),
		FromFile: name, ToFile: name + " (suggested)", Context: 2})
	return s
}
