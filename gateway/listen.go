package gateway

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/mark3labs/mcp-go/mcp"

	"github.com/sandgate/sandgate/audit"
	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/jsonenc"
	"github.com/sandgate/sandgate/internal/jsonscan"
)

// On 2026-07-28 a sandbox hears of list changes and resource updates on a subscriptions/listen
// stream, which the gateway serves itself, whatever its upstreams speak: the stream's first
// message acknowledges what is honored (the resources the caller may read, each a subscription
// of the upstream's: resources/subscribe on the sandbox's upstream session of a legacy
// upstream (its own, or the shared one), the filter of a 2026-07-28 upstream's listen stream), and every message on it carries the listen
// request's ID as its _meta subscriptionId. A list change is told when what the caller would be
// shown now differs from what it was shown when the stream opened or was last told (as on the
// GET stream of the legacy revisions, listchanged.go); progress and log messages never go here.
// The stream is one call, audited when it ends: closed by the sandbox, or by Sandgate's
// shutdown, which sends the listen's result first.

// listener is one subscriptions/listen stream.
type listener struct {
	key    string          // its subscriber key (listenPrefix + N)
	id     json.RawMessage // the listen request's ID: every message's subscriptionId
	who    caller
	filter mcp.SubscriptionFilter
	events chan []byte // its messages, as they come
	gone   chan struct{}
	once   sync.Once

	mu    sync.Mutex
	shown map[mcp.MCPMethod]map[string]bool // what each list it listens to showed, last told
}

// listenPrefix starts a listener's subscriber key.
const listenPrefix = "listen/"

// listeners are this replica's listen streams, by key.
type listeners struct {
	mu    sync.Mutex
	byKey map[string]*listener
	next  atomic.Uint64
}

func newListeners() *listeners { return &listeners{byKey: map[string]*listener{}} }

func (ls *listeners) get(key string) *listener {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.byKey[key]
}

func (ls *listeners) all() []*listener {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return slices.Collect(maps.Values(ls.byKey))
}

// listenBuffer bounds the messages waiting to be written to one listen stream: a sandbox that
// reads slower loses the stream (and opens it again), not Sandgate's memory.
const listenBuffer = 64

// listen serves subscriptions/listen until the sandbox closes the stream or Sandgate shuts down.
func (x *exchange) listen(ctx context.Context, _ call.Grant) (response, call.End) {
	g := x.g
	var p struct {
		Notifications mcp.SubscriptionFilter `json:"notifications"`
	}
	_ = json.Unmarshal(orNull(x.msg.Params), &p)
	l := &listener{key: listenPrefix + strconv.FormatUint(g.listens.next.Add(1), 10), id: x.msg.ID, who: x.caller(),
		filter: p.Notifications, events: make(chan []byte, listenBuffer), gone: make(chan struct{}), shown: map[mcp.MCPMethod]map[string]bool{}}
	for _, lc := range listChanges {
		if l.wants(lc.notification) {
			l.shown[lc.method] = g.visibleNames(ctx, l.who, lc.method)
		}
	}
	honored := l.filter
	honored.ResourceSubscriptions = nil
	for _, uri := range l.filter.ResourceSubscriptions {
		if u, ok := g.resourceUpstream(uri); ok && g.visible(ctx, l.who, audit.KindResourcesRead, u.cfg.Name, uri) {
			g.subscribeUpstream(ctx, u, uri, l.key, l.who.sessionKey(), true)
			defer g.subscribeUpstream(context.WithoutCancel(ctx), u, uri, l.key, l.who.sessionKey(), false)
			honored.ResourceSubscriptions = append(honored.ResourceSubscriptions, uri)
		}
	}
	g.listens.mu.Lock()
	g.listens.byKey[l.key] = l
	g.listens.mu.Unlock()
	defer func() {
		g.listens.mu.Lock()
		delete(g.listens.byKey, l.key)
		g.listens.mu.Unlock()
	}()
	x.out.mu.Lock()
	x.out.startSSE()
	x.out.mu.Unlock()
	ack, _ := json.Marshal(map[string]any{"notifications": honored})
	if err := x.w.writeEvent("", notificationBytes(mcp.MethodNotificationSubscriptionsAcknowledged, l.withID(ack)), sseWriteTimeout); err != nil {
		return response{}, call.Answered(http.StatusOK)
	}
	return l.serve(ctx, x)
}

// serve writes the stream's messages until it ends.
func (l *listener) serve(ctx context.Context, x *exchange) (response, call.End) {
	for {
		select {
		case msg := <-l.events:
			if err := x.w.writeEvent("", msg, sseWriteTimeout); err != nil {
				return response{}, call.Answered(http.StatusOK)
			}
		case <-l.gone:
			x.cl.Note("stream_too_slow")
			return response{}, call.Answered(http.StatusOK)
		case <-ctx.Done():
			return response{}, call.Answered(http.StatusOK)
		case <-x.g.streams.Done():
			// Sandgate shuts down: the listen's result ends the stream gracefully.
			res := l.withID([]byte(`{"resultType":"complete"}`))
			_ = x.w.writeEvent("", x.result(res), sseWriteTimeout)
			return response{}, call.Answered(http.StatusOK)
		}
	}
}

// wants reports whether the stream listens to notification.
func (l *listener) wants(notification string) bool {
	switch notification {
	case mcp.MethodNotificationToolsListChanged:
		return l.filter.ToolsListChanged
	case mcp.MethodNotificationPromptsListChanged:
		return l.filter.PromptsListChanged
	case mcp.MethodNotificationResourcesListChanged:
		return l.filter.ResourcesListChanged
	}
	return false
}

// withID is params, an object, with the stream's subscriptionId in its _meta (any _meta of the
// protocol's from an upstream's hop replaced).
func (l *listener) withID(params []byte) []byte {
	meta := []byte(`{}`)
	_ = jsonscan.Named(params, []string{"_meta"}, func(_ int, v []byte) error {
		if m, err := withoutProtocolMeta(v); err == nil && m != nil && len(v) > 0 && v[0] == '{' {
			meta = m
		}
		return nil
	})
	meta, err := jsonenc.WithMember(meta, mcp.MetaKeySubscriptionID, l.id)
	if err != nil {
		return params
	}
	out, err := jsonenc.WithMember(params, "_meta", meta)
	if err != nil {
		return params
	}
	return out
}

// deliver sends a notification (method, params) on the stream; one that reads too slowly ends.
func (l *listener) deliver(method string, params []byte) {
	if len(params) == 0 {
		params = []byte(`{}`)
	}
	select {
	case l.events <- notificationBytes(method, l.withID(params)):
	default:
		l.once.Do(func() { close(l.gone) })
	}
}

// tellListener tells l which of its lists changed since it was last told.
func (g *Gateway) tellListener(l *listener) {
	l.mu.Lock()
	shown := maps.Clone(l.shown)
	l.mu.Unlock()
	told := map[string]bool{}
	for _, lc := range listChanges {
		before, ok := shown[lc.method]
		if !ok {
			continue
		}
		now := g.visibleNames(context.Background(), l.who, lc.method)
		if maps.Equal(before, now) {
			continue
		}
		l.mu.Lock()
		l.shown[lc.method] = now
		l.mu.Unlock()
		if !told[lc.notification] {
			told[lc.notification] = true
			l.deliver(lc.notification, nil)
		}
	}
}
