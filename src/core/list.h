/* list.h - the intrusive doubly-linked list (circular, with a head): the daemon's registries
 * and the bridge's connections and calls embed a struct conch_list in their records. */
#ifndef CONCH_CORE_LIST_H
#define CONCH_CORE_LIST_H

#include <stdbool.h>
#include <stddef.h>

struct conch_list {
    struct conch_list *prev, *next;
};

/* An empty list, or a node in none: it points at itself. */
#define CONCH_LIST_INIT(l) ((l)->prev = (l)->next = (l))
/* The record of @type whose @member is the node @p. */
#define conch_list_entry(p, type, member) ((type *)((char *)(p)-offsetof(type, member)))
/* Every node of @head, in order; the current one (@pos) may be deleted. */
#define conch_list_for_each_safe(pos, tmp, head)                                                   \
    for (pos = (head)->next, tmp = pos->next; pos != (head); pos = tmp, tmp = pos->next)

/* conch_list_add - append @item at the end of @head. */
static inline void conch_list_add(struct conch_list *head, struct conch_list *item)
{
    item->prev = head->prev;
    item->next = head;
    head->prev->next = item;
    head->prev = item;
}

/* conch_list_del - take @item out of its list; it is then in none (deleting it again is a
 * no-op). */
static inline void conch_list_del(struct conch_list *item)
{
    item->prev->next = item->next;
    item->next->prev = item->prev;
    CONCH_LIST_INIT(item);
}

/* conch_list_empty - whether @head holds no node. */
static inline bool conch_list_empty(const struct conch_list *head)
{
    return head->next == head;
}

#endif
