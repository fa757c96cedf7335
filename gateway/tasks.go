package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/jsonscan"
)

// Tasks are relayed, never made by Sandgate: a tools/call an upstream answers with a task (the
// 2025-11-25 model's {"task":{…}}, or 2026-07-28's tasks extension, resultType "task") gives
// that task to the sandbox that made the call, and only to it. tasks/get, tasks/result,
// tasks/cancel (and the extension's tasks/update) of a task go to the upstream, on the
// upstream session it was made on, when the caller is the sandbox that owns it; any other
// caller is answered as for a task that does not exist, and the request is audited (kind
// mcp.tasks, not_found). tasks/list lists the caller's own tasks only. Tasks are offered to a
// sandbox (initialize's capabilities, server/discover's extensions) when an upstream of its
// revision offers them; a task an upstream of the other model makes is not relayed (the call
// fails upstream_error). A replica knows the tasks made through it: another replica answers
// "not found", as for a task of someone else.

// tasksExtension is 2026-07-28's tasks extension.
const tasksExtension = "io.modelcontextprotocol/tasks"

// taskTTL bounds how long a task's owner is remembered.
const taskTTL = 24 * time.Hour

// taskOwner is who a task belongs to, and where it lives.
type taskOwner struct {
	sandbox string // identity.Identity.Key()
	up      *upstream
	modern  bool // made in 2026-07-28's extension
	expires time.Time
}

// taskOwners are the tasks made through this replica, by task ID (two upstreams may choose
// one ID: each has its owner).
type taskOwners struct {
	mu    sync.Mutex
	byID  map[string][]taskOwner
	swept time.Time
}

func newTaskOwners() *taskOwners { return &taskOwners{byID: map[string][]taskOwner{}} }

// owner is task id's owner, when it is sandbox's.
func (t *taskOwners) owner(id, sandbox string) (taskOwner, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	if now.Sub(t.swept) > time.Minute {
		t.swept = now
		for k, os := range t.byID {
			os = slices.DeleteFunc(os, func(o taskOwner) bool { return now.After(o.expires) })
			if len(os) == 0 {
				delete(t.byID, k)
			} else {
				t.byID[k] = os
			}
		}
	}
	for _, o := range t.byID[id] {
		if o.sandbox == sandbox && now.Before(o.expires) {
			return o, true
		}
	}
	return taskOwner{}, false
}

// madeTask remembers the task res, a tools/call result of x's, made if it is one; false when it
// is a task the sandbox cannot take (2026-07-28's, for a request that did not declare the
// extension).
func (x *exchange) madeTask(res []byte) bool {
	if !bytes.Contains(res, []byte(`"taskId"`)) {
		return true
	}
	var f struct {
		ResultType string `json:"resultType"`
		TaskID     string `json:"taskId"`
		Task       *struct {
			TaskID string `json:"taskId"`
		} `json:"task"`
	}
	if json.Unmarshal(res, &f) != nil {
		return true
	}
	id, modern := f.TaskID, true
	if f.ResultType != "task" {
		id, modern = "", false
		if f.Task != nil {
			id = f.Task.TaskID
		}
	}
	if id == "" {
		return true
	}
	if modern && (x.meta.caps == nil || x.meta.caps.Extensions[tasksExtension] == nil) {
		return false
	}
	t := x.g.tasks
	t.mu.Lock()
	t.byID[id] = append(t.byID[id], taskOwner{sandbox: x.id.Key(), up: x.up, modern: modern,
		expires: time.Now().Add(taskTTL)})
	t.mu.Unlock()
	x.cl.Note("task_created")
	return true
}

// askTask is the question of tasks/get, tasks/result, tasks/cancel and tasks/update: none of
// policy's (the call that made the task was decided), but the task must be the caller's.
func askTask(_ context.Context, x *exchange) (call.Question, *call.Refusal) {
	id := jsonscan.String(x.msg.p.taskID)
	x.cl.Describe(audit.Target{Tool: id})
	o, ok := x.g.tasks.owner(id, x.id.Key())
	if !ok || o.modern != x.modern {
		return call.Question{}, notFound("task not found")
	}
	x.up, x.name = o.up, id
	x.cl.Describe(audit.Target{Upstream: o.up.cfg.Name})
	return call.Question{}, nil
}

// task forwards a task request to the task's upstream.
func (x *exchange) task(ctx context.Context, _ call.Grant) (response, call.End) {
	params := relayed{name: x.name, named: true}
	params.members, params.meta = splitMeta(x.msg.Params)
	res, err := x.send(ctx, params)
	return x.answerWith(res, err)
}

// splitMeta is params' members but _meta, and _meta's members to keep (hopMeta).
func splitMeta(params []byte) (members, meta []byte) {
	p := relayed{}
	if params == nil {
		return nil, nil
	}
	_ = jsonscan.Each(params, func(key []byte, name string, val []byte) {
		if name == "_meta" {
			p.meta = hopMeta(val)
			return
		}
		p.add(string(key), val)
	})
	return p.members, p.meta
}

// listTasks answers tasks/list (2025-11-25) with the caller's own tasks, from every upstream
// that offers tasks.
func (x *exchange) listTasks(ctx context.Context, _ call.Grant) (response, call.End) {
	var mine []json.RawMessage
	for _, u := range x.g.upstreams {
		cli, _, err := u.client()
		if err != nil || cli.GetServerCapabilities().Tasks == nil || mcp.IsModernProtocol(cli.ProtocolVersion()) {
			continue
		}
		x.up, x.name = u, ""
		raw, err := x.send(ctx, relayed{}) // on the caller's upstream session, where its tasks are
		if err != nil {
			continue
		}
		var page struct {
			Tasks []json.RawMessage `json:"tasks"`
		}
		_ = json.Unmarshal(raw, &page)
		for _, t := range page.Tasks {
			var f struct {
				TaskID string `json:"taskId"`
			}
			if json.Unmarshal(t, &f) == nil {
				if _, ok := x.g.tasks.owner(f.TaskID, x.id.Key()); ok {
					mine = append(mine, t)
				}
			}
		}
	}
	b, _ := json.Marshal(map[string]any{"tasks": orEmpty(mine)})
	return x.respond(x.result(b)), call.Answered(http.StatusOK)
}

func orEmpty(ts []json.RawMessage) []json.RawMessage {
	if ts == nil {
		return []json.RawMessage{}
	}
	return ts
}

// anyUpstreamTasks reports whether an upstream of the revision modern says offers tasks.
func (g *Gateway) anyUpstreamTasks(modern bool) bool {
	for _, u := range g.upstreams {
		cli, _, err := u.client()
		if err != nil || mcp.IsModernProtocol(cli.ProtocolVersion()) != modern {
			continue
		}
		caps := cli.GetServerCapabilities()
		if modern && caps.Extensions[tasksExtension] != nil || !modern && caps.Tasks != nil {
			return true
		}
	}
	return false
}

// legacyTasksCapability is the tasks capability Sandgate offers a 2025-11-25 sandbox.
func legacyTasksCapability() *mcp.TasksCapability {
	return &mcp.TasksCapability{List: &struct{}{}, Cancel: &struct{}{}, Requests: &mcp.TaskRequestsCapability{
		Tools: &struct {
			Call *struct{} `json:"call,omitempty"`
		}{Call: &struct{}{}}}}
}
