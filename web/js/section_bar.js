// @ts-check
// The run page's section bar: one link per section marked `data-section="Label"`, sticky under
// the top bar, the section in view highlighted. The page is ~5,000 px long: this is how one gets
// from the findings to the events without scrolling through every chart. Sections still hidden
// (findings before they load, a run without optimizers' panel) have no link until shown.

import { el } from './format.js';

const TOP_BAR_PX = 48 + 44; // the top bar and this bar: a section scrolled to starts below both

/** @param {string} text */
function slug(text) {
  return `section-${text.toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-|-$/g, '')}`;
}

export class SectionBar {
  /** @param {HTMLElement} nav  the bar; sections come from the document */
  constructor(nav) {
    this.nav = nav;
    /** @type {HTMLElement | null} the section a link was clicked for */
    this.pinned = null;
    this.sections = /** @type {HTMLElement[]} */ ([...document.querySelectorAll('[data-section]')]);
    this.links = this.sections.map((section) => {
      const label = /** @type {string} the selector's */ (section.dataset.section);
      if (!section.id) section.id = slug(label);
      const link = el('a', 'section-link', label);
      link.href = `#${section.id}`;
      link.addEventListener('click', (event) => {
        event.preventDefault();
        const y = section.getBoundingClientRect().top + window.scrollY - TOP_BAR_PX;
        window.scrollTo({ top: y });
        history.replaceState(history.state, '', `${location.pathname}${location.search}#${section.id}`);
        this.pinned = section;
        this.mark(section);
      });
      return link;
    });
    nav.replaceChildren(...this.links);
    this.sync();
    // Sections shown later (findings, optimizers) get their link then.
    new MutationObserver(() => this.sync()).observe(/** @type {HTMLElement} run.html's */ (document.querySelector('main')),
      { attributes: true, attributeFilter: ['hidden'], subtree: true });
    window.addEventListener('scroll', () => this.onScroll(), { passive: true });
  }

  sync() {
    // Only real changes: each one is a mutation this observer hears (the bar is in <main>).
    this.sections.forEach((section, i) => {
      if (this.links[i].hidden !== section.hidden) this.links[i].hidden = section.hidden;
    });
    this.onScroll();
  }

  /** The section in view: the last one whose top has passed under the bars. */
  onScroll() {
    // A section picked near the page's end cannot reach the top: it stays current while shown.
    if (this.pinned) {
      const top = this.pinned.getBoundingClientRect().top;
      if (top >= 0 && top < window.innerHeight) {
        this.mark(this.pinned);
        return;
      }
      this.pinned = null;
    }
    let current = null;
    for (const section of this.sections) {
      if (!section.hidden && section.getBoundingClientRect().top <= TOP_BAR_PX + 8) current = section;
    }
    this.mark(current);
  }

  /** @param {HTMLElement | null} section  the current one (null: none) */
  mark(section) {
    this.sections.forEach((s, i) => {
      if (s === section) this.links[i].setAttribute('aria-current', 'true');
      else this.links[i].removeAttribute('aria-current');
    });
  }
}

const nav = document.getElementById('section-bar');
if (nav) new SectionBar(nav);
