package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sandgate/sandgate/internal/catalogs"
)

// A gateway starts ready, not early, and keeps an upstream's tools through its outages
// (docs/mcp-gateway.md, "When an upstream is down"):
//   - each upstream's catalog is saved whenever it is listed (Options.Catalogs: a file beside
//     the audit log, or Redis), and loaded at start, so that an upstream that is down, or slow to
//     connect, keeps its tools listed; their calls answer upstream_unavailable (503) until it
//     connects;
//   - a call that comes while an upstream's first connection attempt is still under way waits
//     for it (connect_timeout at most), and /readyz says not ready until every upstream was
//     tried once (Tried);
//   - an upstream never seen (no catalog saved, not connected) answers upstream_unavailable for
//     any tool under its prefix (unseenFor), rather than "tool not found".

// CatalogStore keeps each upstream's last listed catalog across restarts (internal/catalogs).
type CatalogStore interface {
	// Load returns what Save stored for upstream, nil when nothing was.
	Load(ctx context.Context, upstream string) ([]byte, error)
	Save(ctx context.Context, upstream string, b []byte) error
}

// catalogTimeout bounds a load or save of a catalog.
const catalogTimeout = 2 * time.Second

// source names the server an upstream's catalog comes from.
func (u *upstream) source() string {
	if u.cfg.IsStdio() {
		return "command:" + strings.Join(append([]string{u.cfg.Command}, u.cfg.Args...), " ")
	}
	return "url:" + u.cfg.URL
}

func saveEntries(es []rawEntry) []catalogs.Entry {
	out := make([]catalogs.Entry, len(es))
	for i, e := range es {
		out[i] = catalogs.Entry{ID: e.id, Raw: e.raw}
	}
	return out
}

func loadEntries(es []catalogs.Entry) []rawEntry {
	out := make([]rawEntry, len(es))
	for i, e := range es {
		out[i] = rawEntry{id: e.ID, raw: e.Raw}
	}
	return out
}

func encodeCatalog(u *upstream, c catalog) ([]byte, error) {
	return json.Marshal(catalogs.Saved{Source: u.source(), Saved: time.Now().UTC(), Tools: saveEntries(c.tools),
		Resources: saveEntries(c.resources), Templates: saveEntries(c.templates), Prompts: saveEntries(c.prompts), Meta: c.meta, TTL: c.ttl})
}

func decodeCatalog(u *upstream, b []byte) (catalog, error) {
	var s catalogs.Saved
	if err := json.Unmarshal(b, &s); err != nil {
		return catalog{}, err
	}
	if s.Source != u.source() {
		return catalog{}, fmt.Errorf("saved from %s, not %s", s.Source, u.source())
	}
	return catalog{meta: s.Meta, ttl: s.TTL, tools: loadEntries(s.Tools), resources: loadEntries(s.Resources),
		templates: loadEntries(s.Templates), prompts: loadEntries(s.Prompts)}, nil
}

// loadCatalogs gives each upstream the catalog saved for it, when there is one of its server.
func (g *Gateway) loadCatalogs() {
	if g.opts.Catalogs == nil {
		return
	}
	for _, u := range g.upstreams {
		ctx, cancel := context.WithTimeout(context.Background(), catalogTimeout)
		b, err := g.opts.Catalogs.Load(ctx, u.cfg.Name)
		cancel()
		if err != nil || b == nil {
			if err != nil {
				u.log.Warn("last known catalog not read; the upstream's tools are listed once it connects", "err", err)
			}
			continue
		}
		c, err := decodeCatalog(u, b)
		if err != nil {
			u.log.Warn("last known catalog not used", "err", err)
			continue
		}
		u.remember(c)
		u.log.Info("upstream listed from its last known catalog until it connects", "tools", len(c.tools))
	}
}

// saveCatalog stores what u listed, when it changed since the last save.
func (g *Gateway) saveCatalog(u *upstream, c catalog) {
	if g.opts.Catalogs == nil {
		return
	}
	b, err := encodeCatalog(u, c)
	if err != nil {
		u.log.Warn("catalog not saved", "err", err)
		return
	}
	u.saveMu.Lock()
	defer u.saveMu.Unlock()
	if u.saved != nil && catalogs.Same(u.saved, b) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), catalogTimeout)
	defer cancel()
	if err := g.opts.Catalogs.Save(ctx, u.cfg.Name, b); err != nil {
		u.log.Warn("catalog not saved; a restart while the upstream is down will not list its tools", "err", err)
		return
	}
	u.saved = b
}

// Tried is nil once every upstream's first connection attempt ended (connected or not): until
// then /readyz says not ready, so that no sandbox is sent here before the catalog is known.
func (g *Gateway) Tried() error {
	var waiting []string
	for _, u := range g.upstreams {
		select {
		case <-u.tried:
		default:
			waiting = append(waiting, u.cfg.Name)
		}
	}
	if len(waiting) > 0 {
		return fmt.Errorf("first connection attempt to %s under way", strings.Join(waiting, ", "))
	}
	return nil
}

// awaitFirstTry waits until u's first connection attempt ended, or ctx does.
func (u *upstream) awaitFirstTry(ctx context.Context) error {
	select {
	case <-u.tried:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// unseenFor is the upstream a tool name that is in no catalog belongs to while that upstream
// was never seen (no catalog known): the first such upstream whose prefix starts the name, else
// the first such one whose tools may carry no prefix. nil when every upstream was seen.
func (g *Gateway) unseenFor(name string) *upstream {
	if g.unseen.Load() == 0 {
		return nil
	}
	var bare *upstream
	for _, u := range g.upstreams {
		if u.seen() {
			continue
		}
		if strings.HasPrefix(name, u.cfg.Name+"_") {
			return u
		}
		if bare == nil && u.cfg.Prefix != "always" {
			bare = u
		}
	}
	return bare
}

var errNeverSeen = errors.New("never connected since start, and no catalog of it was saved")

// unseenTool is the upstream and upstream name of a tools/call's tool that is in no catalog,
// whose name belongs to an upstream never seen (unseenFor), once that upstream's first
// connection attempt ended without the tool: policy decides the call as a call to that
// upstream, and an allowed one answers upstream_unavailable (forward.go). ok is false when the
// name is no such tool.
func (g *Gateway) unseenTool(ctx context.Context, name string) (*upstream, string, bool) {
	u := g.unseenFor(name)
	if u == nil {
		return nil, "", false
	}
	if u.awaitFirstTry(ctx) == nil {
		if _, ok := g.tool(name); ok {
			return nil, "", false // it connected meanwhile and has the tool
		}
	}
	tool := name
	if u.cfg.Prefix == "always" || strings.HasPrefix(name, u.cfg.Name+"_") {
		tool = strings.TrimPrefix(name, u.cfg.Name+"_")
	}
	return u, tool, true
}
