// Command mcp-upstream is a tiny MCP server over stdio, the example upstream `make run` puts
// behind Sandgate. Its tools match the `everything` upstream of policies/data.yaml:
//
//	echo      returns its message
//	add       adds two numbers
//	get-time  returns the current time (RFC 3339, UTC)
//	get-env   says whether the variable named by -secret-env is set (never its value)
//
// Flags: -name sets the server name; -tool-prefix adds a prefix to every tool name (tests use
// it to produce name conflicts).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

func main() {
	name := flag.String("name", "mcp-upstream", "server name")
	prefix := flag.String("tool-prefix", "", "prefix for every tool name")
	secretEnv := flag.String("secret-env", "UPSTREAM_TOKEN", "environment variable get-env reports on")
	sampling := flag.Bool("sampling", false, "add the tool ask-model, which asks the client's model (sampling/createMessage)")
	flag.Parse()
	if err := server.ServeStdio(newServer(*name, *prefix, *secretEnv, *sampling)); err != nil {
		fmt.Fprintln(os.Stderr, "mcp-upstream:", err)
		os.Exit(1)
	}
}

// Every tool states its hints: mcp-go's defaults call a tool destructive and open-world, and
// clients ask before calling such a tool. None of these changes anything.
var (
	readOnly   = []mcp.ToolOption{mcp.WithReadOnlyHintAnnotation(true), mcp.WithDestructiveHintAnnotation(false)}
	idempotent = mcp.WithIdempotentHintAnnotation(true)
	closed     = mcp.WithOpenWorldHintAnnotation(false)
)

// tool is mcp.NewTool with the read-only hints first.
func tool(name string, opts ...mcp.ToolOption) mcp.Tool {
	return mcp.NewTool(name, append(append([]mcp.ToolOption(nil), readOnly...), opts...)...)
}

func newServer(name, prefix, secretEnv string, sampling bool) *server.MCPServer {
	s := server.NewMCPServer(name, "1.0.0", server.WithToolCapabilities(true))
	if sampling {
		s.EnableSampling()
		s.AddTool(tool(prefix+"ask-model", mcp.WithDescription("Asks the client's model a question"),
			mcp.WithIdempotentHintAnnotation(false), mcp.WithString("question", mcp.Required())),
			func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				q, err := req.RequireString("question")
				if err != nil {
					return mcp.NewToolResultError(err.Error()), nil
				}
				//lint:ignore SA1019 the example upstream shows sampling bridged to the sandbox, which
				// the protocol revisions before 2026-07-28 that sandboxes speak today still have.
				res, err := s.RequestSampling(ctx, mcp.CreateMessageRequest{CreateMessageParams: mcp.CreateMessageParams{
					Messages:  []mcp.SamplingMessage{{Role: mcp.RoleUser, Content: mcp.NewTextContent(q)}},
					MaxTokens: 100,
				}})
				if err != nil {
					return mcp.NewToolResultError("sampling: " + err.Error()), nil
				}
				if tc, ok := res.Content.(mcp.TextContent); ok {
					return mcp.NewToolResultText("model says: " + tc.Text), nil
				}
				return mcp.NewToolResultText(fmt.Sprintf("model says: %v", res.Content)), nil
			})
	}
	s.AddTool(tool(prefix+"echo", mcp.WithDescription("Returns its message"), idempotent, closed,
		mcp.WithString("message", mcp.Required(), mcp.Description("text to echo"))),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			msg, err := req.RequireString("message")
			if err != nil {
				return mcp.NewToolResultError(err.Error()), nil
			}
			return mcp.NewToolResultText(msg), nil
		})
	s.AddTool(tool(prefix+"add", mcp.WithDescription("Adds two numbers"), idempotent, closed,
		mcp.WithNumber("a", mcp.Required()), mcp.WithNumber("b", mcp.Required())),
		func(_ context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			a, err := req.RequireFloat("a")
			if err != nil {
				return mcp.NewToolResultError(err.Error()), nil
			}
			b, err := req.RequireFloat("b")
			if err != nil {
				return mcp.NewToolResultError(err.Error()), nil
			}
			return mcp.NewToolResultText(fmt.Sprint(a + b)), nil
		})
	s.AddTool(tool(prefix+"get-time", mcp.WithDescription("Returns the current time"), mcp.WithIdempotentHintAnnotation(false), closed),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(time.Now().UTC().Format(time.RFC3339)), nil
		})
	s.AddTool(tool(prefix+"get-env", mcp.WithDescription("Says whether the configured secret variable is set"), idempotent, closed),
		func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			_, ok := os.LookupEnv(secretEnv)
			return mcp.NewToolResultText(fmt.Sprintf("%s set: %t", secretEnv, ok)), nil
		})
	return s
}
