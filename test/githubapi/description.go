package githubapi

import (
	"bytes"

	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// descriptionFile is GitHub's REST API description as @octokit/openapi publishes it (OpenAPI
// 3.0.3; its schemas are JSON Schema draft 4 with OpenAPI's few keywords, which a draft 4
// validator ignores).
const descriptionFile = "test/node/node_modules/@octokit/openapi/generated/api.github.com.json"

const descriptionURL = "https://sandgate.test/api.github.com.json"

var description struct {
	once sync.Once
	doc  any
	err  error
}

// loadDescription reads the description once per test binary; missing, the test skips (or
// fails under SANDGATE_REQUIRE_TOOLS: test/setup.sh installs it).
func loadDescription(t testing.TB) map[string]any {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(file), "..", "..", descriptionFile)
	if _, err := os.Stat(path); err != nil {
		if os.Getenv("SANDGATE_REQUIRE_TOOLS") != "" {
			t.Fatalf("%s is missing (SANDGATE_REQUIRE_TOOLS is set): run test/setup.sh", path)
		}
		t.Skipf("%s is missing: run test/setup.sh", path)
	}
	description.once.Do(func() {
		f, err := os.Open(path)
		if err != nil {
			description.err = err
			return
		}
		defer f.Close()
		description.doc, description.err = jsonschema.UnmarshalJSON(f)
	})
	if description.err != nil {
		t.Fatalf("read GitHub's description: %v", description.err)
	}
	return description.doc.(map[string]any)
}

// CheckAnswers checks each answer against GitHub's description: the operation exists, the
// status is one it documents, and the body is valid under that response's schema (none for a
// response without content).
func CheckAnswers(t testing.TB, answers []Answer) {
	t.Helper()
	doc := loadDescription(t)
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft4)
	if err := c.AddResource(descriptionURL, doc); err != nil {
		t.Fatalf("add GitHub's description: %v", err)
	}
	for _, a := range answers {
		if err := checkAnswer(c, doc, a); err != nil {
			t.Errorf("%s %s (%s) answered %d: %v\nbody: %s", strings.ToUpper(a.Method), a.URL, a.Path, a.Status, err, a.Body)
		}
	}
}

func checkAnswer(c *jsonschema.Compiler, doc map[string]any, a Answer) error {
	paths, _ := doc["paths"].(map[string]any)
	item, _ := paths[a.Path].(map[string]any)
	op, _ := item[a.Method].(map[string]any)
	if op == nil {
		return fmt.Errorf("the description has no operation %s %s", a.Method, a.Path)
	}
	ptr := "/paths/" + escape(a.Path) + "/" + a.Method + "/responses/" + strconv.Itoa(a.Status)
	responses, _ := op["responses"].(map[string]any)
	resp, _ := responses[strconv.Itoa(a.Status)].(map[string]any)
	if resp == nil {
		return fmt.Errorf("status %d is not one the description documents for this operation", a.Status)
	}
	if ref, ok := resp["$ref"].(string); ok { // a shared response: #/components/responses/…
		ptr = strings.TrimPrefix(ref, "#")
		resp = lookup(doc, ptr)
	}
	content, _ := resp["content"].(map[string]any)
	media, _ := content["application/json"].(map[string]any)
	if media == nil || media["schema"] == nil {
		if len(a.Body) > 0 {
			return fmt.Errorf("the description documents no body for this answer")
		}
		return nil
	}
	sch, err := c.Compile(descriptionURL + "#" + ptr + "/content/application~1json/schema")
	if err != nil {
		return fmt.Errorf("compile the schema: %w", err)
	}
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(a.Body))
	if err != nil {
		return fmt.Errorf("the body is not JSON: %w", err)
	}
	return sch.Validate(v)
}

// escape is a JSON pointer token (RFC 6901).
func escape(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

func lookup(doc map[string]any, ptr string) map[string]any {
	var v any = doc
	for _, tok := range strings.Split(strings.TrimPrefix(ptr, "/"), "/") {
		m, _ := v.(map[string]any)
		v = m[strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")]
	}
	m, _ := v.(map[string]any)
	return m
}
