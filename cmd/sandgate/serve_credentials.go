package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandgate/sandgate/internal/call"
	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/credential"
	"github.com/sandgate/sandgate/internal/grants"
	"github.com/sandgate/sandgate/internal/kube"
)

// mintedCredentials wires the credentials minted per sandbox run (docs/credentials.md): their
// lifecycle events go to the request path's audit log, the request path puts their scope in
// the policy input, and a run's tokens end when its claim or sandbox is gone (sandboxGone) or
// its grant is deleted through the admin API (the grants store returned, which tells the other
// replicas through Redis when there is one). Without minted credentials it changes nothing.
// Tokens live on the wall clock: serve's clock (budgets', pinned by tests) is not theirs.
func mintedCredentials(d *serveDeps, shared *sharedState) (components []component, err error) {
	if !hasMinted(d.cfg) {
		return nil, nil
	}
	err = d.creds.EnableMinting(d.cfg, credential.MintOptions{Recorder: recorderFunc(func(e credential.Event) { d.core.CredentialEvent(e) }),
		Meters: d.meters})
	if err != nil {
		return nil, err
	}
	ends := runEnds{Store: d.grants, creds: d.creds}
	if shared.client != nil {
		ends.notices = credential.NewRunEndNotices(shared.client, d.cfg.Redis.KeyPrefix, d.creds, d.log.With("component", "credentials"))
		components = append(components, componentFunc(func(ctx context.Context) error { ends.notices.Run(ctx); return nil }))
	}
	d.grants = ends
	if s := d.cfg.RunTokens; s != nil && s.JWKSSecret != nil {
		components = append(components, componentFunc(func(ctx context.Context) error {
			publishJWKS(ctx, d.cfg, d.creds.JWKS(), d.log.With("component", "credentials"))
			return nil
		}))
	}
	return components, nil
}

func hasMinted(cfg *config.Config) bool {
	for _, c := range cfg.Credentials {
		if c.Minted() {
			return true
		}
	}
	return false
}

type recorderFunc func(credential.Event)

func (f recorderFunc) CredentialEvent(e credential.Event) { f(e) }

// runEnds is the grants store of the admin API: deleting a run's grant (or all its grants) ends
// the run's minted tokens here and, through Redis, on every replica.
type runEnds struct {
	grants.Store
	creds   *credential.Store
	notices *credential.RunEndNotices // nil without Redis
}

func (r runEnds) Delete(ctx context.Context, key, name string) error {
	err := r.Store.Delete(ctx, key, name)
	r.end(key, fmt.Sprintf("its grant %q was deleted", name))
	return err
}

func (r runEnds) DeleteSandbox(ctx context.Context, key string) error {
	err := r.Store.DeleteSandbox(ctx, key)
	r.end(key, "its grants were deleted")
	return err
}

func (r runEnds) end(key, reason string) {
	r.creds.Forget(key, reason)
	if r.notices != nil {
		r.notices.Publish(key, reason)
	}
}

// runGone ends the minted tokens of a deleted claim's or sandbox's runs (every replica sees the
// deletion itself), after gone (the grants' cleanup).
func runGone(creds *credential.Store, gone func(key string)) func(key string) {
	return func(key string) {
		gone(key)
		reason := "its sandbox was deleted"
		if strings.Contains(key, "/claims/") {
			reason = "its claim was deleted"
		}
		creds.Forget(key, reason)
	}
}

// jwksHandler serves the run tokens' public keys (GET /.well-known/jwks.json on the admin
// listener), for an IdP that reads keys from a URL; 404 without run_tokens.
func jwksHandler(creds *credential.Store) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		jwks := creds.JWKS()
		if jwks == nil {
			http.Error(w, "no run tokens: set run_tokens to sign them", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/jwk-set+json")
		w.Header().Set("Cache-Control", "max-age=300")
		_, _ = w.Write(jwks)
	}
}

// publishJWKS keeps the JWKS in run_tokens.jwks_secret (key jwks.json) with server-side apply,
// retrying until it is written or ctx ends: for an IdP that reads keys from a file.
func publishJWKS(ctx context.Context, cfg *config.Config, jwks []byte, log *slog.Logger) {
	ref := cfg.RunTokens.JWKSSecret
	body, _ := json.Marshal(map[string]any{"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
		"metadata": map[string]any{"name": ref.Name, "namespace": ref.Namespace,
			"labels": map[string]string{"app.kubernetes.io/managed-by": kube.FieldManager}},
		"data": map[string]string{"jwks.json": base64.StdEncoding.EncodeToString(jwks)}})
	wait := time.Second
	for {
		err := applySecret(ctx, cfg, ref, body)
		if err == nil {
			log.Info("run token keys published", "secret", ref.Namespace+"/"+ref.Name)
			return
		}
		log.Warn("run token keys not published yet; retrying", "secret", ref.Namespace+"/"+ref.Name, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
			wait = min(2*wait, time.Minute)
		}
	}
}

func applySecret(ctx context.Context, cfg *config.Config, ref *config.SecretRef, body []byte) error {
	rc, err := kube.RESTConfig(cfg.Kubernetes.Kubeconfig)
	if err != nil {
		return err
	}
	client, _, err := kube.Clients(rc)
	if err != nil {
		return err
	}
	force := true
	_, err = client.CoreV1().Secrets(ref.Namespace).Patch(ctx, ref.Name, types.ApplyPatchType, body,
		metav1.PatchOptions{FieldManager: kube.FieldManager, Force: &force})
	return err
}

var _ call.MintedCredentials = (*credential.Store)(nil)
