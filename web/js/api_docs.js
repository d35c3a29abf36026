// @ts-check
// The OpenAPI page, rendered by the Swagger UI bundle the server vendors from the installed
// `swagger-ui-bundle-v2` package (no CDN, no inline script: FastAPI's default /docs needs both).
const error = /** @type {HTMLElement} api-docs.html has it */ (document.getElementById('error'));
const SwaggerUIBundle = window.SwaggerUIBundle;
if (typeof SwaggerUIBundle !== 'function') {
  error.textContent = 'Swagger UI is not installed on this server (pip install swagger-ui-bundle-v2)';
  error.hidden = false;
} else {
  SwaggerUIBundle({ url: '/openapi.json', dom_id: '#swagger-ui', deepLinking: true });
}
